// The console's behaviour, kept out of the pages: the Content-Security-Policy runs scripts
// from this site's files only, never inline ones.
"use strict";

// <form data-confirm="..."> and <button data-confirm="..."> ask before they submit.
document.addEventListener("submit", (event) => {
  const message = event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
  const copy = event.target.closest("button[data-copy]");
  if (copy) {
    navigator.clipboard.writeText(document.getElementById(copy.dataset.copy).textContent);
    copy.textContent = "Copied";
  }
});
// <input type="range" data-shows-value> writes its value into the <output> after it.
document.addEventListener("input", (event) => {
  if (event.target.matches("input[data-shows-value]")) {
    event.target.nextElementSibling.value = event.target.value + "%";
  }
});

const COLOURS = ["#2457d6", "#e8590c", "#2f9e44", "#862e9c"];
const LEGEND_BOTTOM = {animation: false, plugins: {legend: {position: "bottom"}}};

// The operations page's last hour: one line (or bar) per deployment, over the minutes.
const perDeployment = (h, field, title, type = "line") => ({type, data: {labels: h.labels,
  datasets: h.deployments.map((d, i) => ({label: d.name, data: d[field],
    borderColor: COLOURS[i % COLOURS.length], backgroundColor: COLOURS[i % COLOURS.length],
    pointRadius: 2, spanGaps: false}))},
  options: {animation: false, plugins: {legend: {position: "bottom"},
    title: {display: true, text: title}},
    scales: {x: {ticks: {maxTicksLimit: 13, maxRotation: 0}}, y: {beginAtZero: true,
      ticks: {precision: field === "ttft_p95" ? undefined : 0}}}}});

// Each chart reads its data from the json_script element its canvas names in data-source.
const CHARTS = {
  spend: (d) => ({type: "line", data: {labels: d.labels, datasets: [
    {label: "spend this month", data: d.spend, borderColor: "#2457d6", fill: false},
    {label: "budget", data: d.budget, borderColor: "#b42318", borderDash: [6, 4], pointRadius: 0}]},
    options: LEGEND_BOTTOM}),
  usage: (u) => ({type: "bar", data: {labels: u.labels,
    datasets: [{label: "tokens", data: u.tokens, backgroundColor: "#2457d6"}]},
    options: {animation: false, plugins: {legend: {display: false}}}}),
  compare: (c) => ({type: "bar", data: {
    labels: ["TTFT p95 (ms)", "ITL p95 (ms)", "error rate (%)", "cost per 1M tokens"],
    datasets: c.map((v, i) => ({label: v.version,
      data: [v.ttft_p95_ms, v.itl_p95_ms, v.error_rate_pct,
        v.cost_per_1k === null ? null : v.cost_per_1k * 1000],
      backgroundColor: COLOURS[i % COLOURS.length]}))},
    options: LEGEND_BOTTOM}),
  hour_tokens: (h) => perDeployment(h, "tokens", "output tokens per minute"),
  hour_ttft: (h) => perDeployment(h, "ttft_p95", "time to first token, p95 (ms)"),
  hour_failed: (h) => perDeployment(h, "failed", "failed requests per minute", "bar"),
};

for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
  const data = JSON.parse(document.getElementById(canvas.dataset.source).textContent);
  new Chart(canvas, CHARTS[canvas.dataset.chart](data));
}
