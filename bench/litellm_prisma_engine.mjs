// Prisma's query engine for LiteLLM's proxy, where Prisma's engine binaries cannot be downloaded.
//
// LiteLLM keeps virtual keys and spend in PostgreSQL through Prisma Client Python, which starts
// Prisma's `query-engine` binary and talks GraphQL to it over HTTP. That binary comes from
// Prisma's own download server; npm ships Prisma's engine compiled to WebAssembly
// (@prisma/query-engine-wasm 5.17, reaching PostgreSQL with node-postgres through
// @prisma/adapter-pg). This program stands where the binary would: it takes the binary's
// arguments and environment, answers its HTTP routes (/status, /, /transaction/...), rewrites
// Prisma Client Python's GraphQL documents into the engine's JSON protocol, and the answers back
// into what the client expects. Every query is still planned and run by Prisma's engine.
//
//     node litellm_prisma_engine.mjs --version
//     PRISMA_DML_PATH=schema.prisma DATABASE_URL=postgresql://... node litellm_prisma_engine.mjs -p 4466

import fs from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import { createRequire } from 'node:module'

const ENGINE_VERSION = '393aa359c9ad4a4bb28630fb5613f9c281cde053'

if (process.argv.includes('--version')) {
  console.log(`query-engine ${ENGINE_VERSION}`)
  process.exit(0)
}

// ------------------------------------------------------------------ GraphQL subset → JSON protocol

const ACTIONS = [
  'findUnique', 'findFirst', 'findMany', 'createOne', 'createMany', 'updateOne', 'updateMany',
  'deleteOne', 'deleteMany', 'upsertOne', 'aggregate', 'groupBy',
]

class RawNumber {
  constructor(text) {
    this.text = text
  }
}

// Prisma Client Python writes one operation: `query|mutation { result: action(args) { fields } }`,
// values as JSON literals, enum values as strings. This reads exactly that.
class Reader {
  constructor(text) {
    this.text = text
    this.at = 0
  }

  fail(what) {
    throw new Error(`GraphQL: expected ${what} at ${this.at}: ${this.text.slice(this.at, this.at + 40)}`)
  }

  skip() {
    while (this.at < this.text.length && /[\s,]/.test(this.text[this.at])) this.at++
  }

  peek() {
    this.skip()
    return this.text[this.at]
  }

  eat(char) {
    if (this.peek() !== char) this.fail(`'${char}'`)
    this.at++
  }

  name() {
    this.skip()
    const match = /^[A-Za-z_][A-Za-z0-9_]*/.exec(this.text.slice(this.at))
    if (!match) this.fail('a name')
    this.at += match[0].length
    return match[0]
  }

  value() {
    const char = this.peek()
    if (char === '{') {
      this.at++
      const object = {}
      while (this.peek() !== '}') {
        const key = this.name()
        this.eat(':')
        object[key] = this.value()
      }
      this.at++
      return object
    }
    if (char === '[') {
      this.at++
      const list = []
      while (this.peek() !== ']') list.push(this.value())
      this.at++
      return list
    }
    if (char === '"') {
      let end = this.at + 1
      while (this.text[end] !== '"') end += this.text[end] === '\\' ? 2 : 1
      const literal = this.text.slice(this.at, end + 1)
      this.at = end + 1
      return JSON.parse(literal)
    }
    const number = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(this.text.slice(this.at))
    if (number) {
      this.at += number[0].length
      return new RawNumber(number[0])
    }
    const word = this.name()
    if (word === 'true') return true
    if (word === 'false') return false
    if (word === 'null') return null
    return word
  }

  args() {
    const args = {}
    if (this.peek() !== '(') return args
    this.at++
    while (this.peek() !== ')') {
      const key = this.name()
      this.eat(':')
      args[key] = this.value()
    }
    this.at++
    return args
  }

  selection() {
    const selection = {}
    if (this.peek() !== '{') return selection
    this.at++
    while (this.peek() !== '}') {
      const field = this.name()
      const args = this.args()
      if (this.peek() === '{' || Object.keys(args).length) {
        selection[field] = { arguments: args, selection: this.selection() }
      } else {
        selection[field] = true
      }
    }
    this.at++
    return selection
  }

  operation(schema) {
    this.name() // query | mutation
    this.eat('{')
    this.name() // the `result` alias
    this.eat(':')
    const field = this.name()
    const args = this.args()
    const selection = this.selection()
    this.eat('}')
    return operationTagged(schema, { ...action(field, schema), query: { arguments: args, selection } })
  }
}

function action(field, schema) {
  if (field === 'queryRaw' || field === 'executeRaw') return { action: field }
  for (const name of ACTIONS) {
    if (!field.startsWith(name)) continue
    const model = field.slice(name.length)
    if (schema.has(model)) return { modelName: model, action: name }
    if (model.endsWith('OrThrow') && schema.has(model.slice(0, -7))) {
      return { modelName: model.slice(0, -7), action: `${name}OrThrow` }
    }
  }
  throw new Error(`GraphQL: unknown operation ${field}`)
}

// The JSON protocol reads a bare string given to a Json field as a JSON string value, where
// GraphQL read it as JSON text: so Json inputs are tagged, which needs each field's type.
const RELATION_OPS = new Set(['is', 'isNot', 'some', 'every', 'none'])

export function schemaRead(datamodel) {
  const models = new Map()
  // A model's block ends at a line holding only `}`: defaults such as "{}" sit inside it.
  for (const [, name, body] of datamodel.matchAll(/^model\s+(\w+)\s*\{(.*?)^\s*\}\s*$/gms)) {
    const fields = new Map()
    for (const line of body.split('\n')) {
      const match = /^\s*(\w+)\s+(\w+)/.exec(line)
      if (match && !line.trim().startsWith('@@')) fields.set(match[1], match[2])
    }
    models.set(name, fields)
  }
  return models
}

function jsonTag(value) {
  return typeof value === 'string' ? { $type: 'Json', value } : value
}

function tagged(schema, model, value, where) {
  if (Array.isArray(value)) return value.map((item) => tagged(schema, model, item, where))
  if (value === null || typeof value !== 'object' || value instanceof RawNumber) return value
  const fields = schema.get(model)
  const out = {}
  for (const [key, item] of Object.entries(value)) {
    const type = fields && fields.get(key)
    if (where && (key === 'AND' || key === 'OR' || key === 'NOT')) {
      out[key] = tagged(schema, model, item, true)
    } else if (type === 'Json') {
      out[key] = jsonTagged(item, where)
    } else if (type && schema.has(type)) {
      out[key] = where ? relationFilter(schema, type, item) : relationWrite(schema, type, item)
    } else {
      out[key] = item
    }
  }
  return out
}

function jsonTagged(value, where) {
  if (value === null || typeof value !== 'object' || value instanceof RawNumber) {
    return jsonTag(value)
  }
  const out = { ...value }
  for (const op of where ? ['equals', 'not', 'array_contains', 'array_starts_with',
    'array_ends_with'] : ['set']) {
    if (op in out) out[op] = jsonTag(out[op])
  }
  return out
}

function relationFilter(schema, model, value) {
  if (value === null || typeof value !== 'object') return value
  const keys = Object.keys(value)
  if (keys.length && keys.every((k) => RELATION_OPS.has(k))) {
    return Object.fromEntries(keys.map((k) => [k, tagged(schema, model, value[k], true)]))
  }
  return tagged(schema, model, value, true)
}

function relationWrite(schema, model, value) {
  if (value === null || typeof value !== 'object') return value
  const data = (v) => tagged(schema, model, v, false)
  const where = (v) => tagged(schema, model, v, true)
  const pair = (v) => (Array.isArray(v)
    ? v.map(pair)
    : { ...v, ...('where' in v ? { where: where(v.where) } : {}),
      ...('data' in v ? { data: data(v.data) } : {}),
      ...('create' in v ? { create: data(v.create) } : {}),
      ...('update' in v ? { update: data(v.update) } : {}) })
  const out = {}
  for (const [op, item] of Object.entries(value)) {
    if (op === 'create') out[op] = data(item)
    else if (op === 'createMany') out[op] = { ...item, data: data(item.data) }
    else if (op === 'update') out[op] = (Array.isArray(item) || 'where' in item) ? pair(item) : data(item)
    else if (op === 'upsert' || op === 'connectOrCreate' || op === 'updateMany') out[op] = pair(item)
    else out[op] = where(item)
  }
  return out
}

function argsTagged(schema, model, args) {
  if (!model) return args
  const out = {}
  for (const [key, value] of Object.entries(args)) {
    if (key === 'where' || key === 'having' || key === 'cursor') {
      out[key] = tagged(schema, model, value, true)
    } else if (key === 'data' || key === 'create' || key === 'update') {
      out[key] = tagged(schema, model, value, false)
    } else {
      out[key] = value
    }
  }
  return out
}

function selectionTagged(schema, model, selection) {
  const fields = schema.get(model)
  const out = {}
  for (const [key, item] of Object.entries(selection)) {
    const type = fields && fields.get(key)
    if (item === true || !type || !schema.has(type)) {
      out[key] = item
    } else {
      out[key] = {
        arguments: argsTagged(schema, type, item.arguments),
        selection: selectionTagged(schema, type, item.selection),
      }
    }
  }
  return out
}

function operationTagged(schema, operation) {
  const { modelName, query } = operation
  if (!modelName) return operation
  return {
    ...operation,
    query: {
      arguments: argsTagged(schema, modelName, query.arguments),
      selection: selectionTagged(schema, modelName, query.selection),
    },
  }
}

function toJson(value) {
  if (value instanceof RawNumber) return value.text
  if (Array.isArray(value)) return `[${value.map(toJson).join(',')}]`
  if (value !== null && typeof value === 'object') {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}:${toJson(v)}`).join(',')}}`
  }
  return JSON.stringify(value)
}

// The JSON protocol tags DateTime, BigInt, Decimal, Json and Bytes as {"$type", "value"}; the
// GraphQL protocol Prisma Client Python parses gives the bare value (Json as its text).
function untag(value) {
  if (Array.isArray(value)) return value.map(untag)
  if (value !== null && typeof value === 'object') {
    if (typeof value.$type === 'string' && 'value' in value && Object.keys(value).length === 2) {
      return value.value
    }
    const out = {}
    for (const [k, v] of Object.entries(value)) out[k] = untag(v)
    return out
  }
  return value
}

// Prisma Client Python 0.11 (LiteLLM's pin) reads raw rows as objects of
// {prisma__type, prisma__value}, the form engines of its time answered with.
function rawRows({ columns, types, rows }) {
  const typed = (type, value) => {
    if (value === null) return { prisma__type: 'null', prisma__value: null }
    if (type.endsWith('-array') && Array.isArray(value)) {
      return { prisma__type: 'array', prisma__value: value.map((v) => typed(type.slice(0, -6), v)) }
    }
    // The driver adapter hands json columns over as text; the binary gave the value itself.
    if (type === 'json' && typeof value === 'string') return { prisma__type: type, prisma__value: JSON.parse(value) }
    return { prisma__type: type, prisma__value: value }
  }
  return rows.map((row) => Object.fromEntries(columns.map((c, i) => [c, typed(types[i], row[i])])))
}

function answer(response, operation) {
  if (!response.data) return response
  let [result] = Object.values(response.data)
  result = untag(result)
  if (operation.action === 'queryRaw') {
    if (typeof result === 'string') result = JSON.parse(result)
    if (result && Array.isArray(result.columns)) result = rawRows(result)
  }
  return { ...response, data: { result } }
}

export function translate(body, schema) {
  const request = JSON.parse(body)
  if (request.batch) {
    const operations = request.batch.map((item) => new Reader(item.query).operation(schema))
    const out = { batch: operations }
    if (request.transaction) out.transaction = {}
    return { body: toJson(out), operations }
  }
  const operation = new Reader(request.query).operation(schema)
  return { body: toJson(operation), operations: [operation] }
}

export function translateAnswer(text, operations) {
  const response = JSON.parse(text)
  if (response.batchResult) {
    const batchResult = response.batchResult.map((item, i) => answer(item, operations[i]))
    return { ...response, batchResult }
  }
  return answer(response, operations[0])
}

// ------------------------------------------------------------------ the engine and its HTTP routes

function option(flag) {
  const i = process.argv.indexOf(flag)
  return i >= 0 ? process.argv[i + 1] : undefined
}

function databaseUrl(datamodel) {
  const overrides = process.env.OVERWRITE_DATASOURCES
  if (overrides) {
    const [first] = JSON.parse(overrides)
    if (first && first.url) return first.url
  }
  const fromEnv = /url\s*=\s*env\("([^"]+)"\)/.exec(datamodel)
  return fromEnv ? process.env[fromEnv[1]] : /url\s*=\s*"([^"]+)"/.exec(datamodel)[1]
}

// Prisma's own pool size unless the URL sets connection_limit; the other Prisma-only URL
// parameters mean nothing to node-postgres.
function poolConfig(url) {
  const parsed = new URL(url)
  const limit = Number(parsed.searchParams.get('connection_limit')) || os.cpus().length * 2 + 1
  for (const key of ['connection_limit', 'pool_timeout', 'pgbouncer', 'schema', 'socket_timeout',
    'statement_cache_size', 'connect_timeout']) {
    parsed.searchParams.delete(key)
  }
  return { connectionString: parsed.toString(), max: limit }
}

// Prisma's own engine reads PostgreSQL's `name` type (catalog views) as text; the driver
// adapter rejects it, and LiteLLM's startup checks query pg_views. Relabel it as text.
const NAME_OID = 19
const NAME_ARRAY_OID = 1003
const TEXT_OID = 25
const TEXT_ARRAY_OID = 1009

function namesAsText(result, parseArray) {
  for (const [i, field] of ((result && result.fields) || []).entries()) {
    if (field.dataTypeID === NAME_OID) field.dataTypeID = TEXT_OID
    if (field.dataTypeID === NAME_ARRAY_OID) {
      field.dataTypeID = TEXT_ARRAY_OID
      for (const row of result.rows) {
        if (typeof row[i] === 'string') row[i] = parseArray(row[i])
      }
    }
  }
  return result
}

function withNamesAsText(queryable, parseArray) {
  const query = queryable.query.bind(queryable)
  queryable.query = async (...args) => namesAsText(await query(...args), parseArray)
  return queryable
}

async function engineStart() {
  const require = createRequire(import.meta.url)
  const pg = require('pg')
  const { PrismaPg } = require('@prisma/adapter-pg')
  const { bindAdapter } = require('@prisma/driver-adapter-utils')
  const runtimePath = require.resolve('@prisma/query-engine-wasm/postgresql/query_engine_bg.js')
  const runtime = await import(runtimePath)
  const wasmPath = runtimePath.replace(/\.js$/, '.wasm')
  const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), {
    './query_engine_bg.js': runtime,
  })
  runtime.__wbg_set_wasm(instance.exports)

  const datamodel = fs.readFileSync(process.env.PRISMA_DML_PATH, 'utf8')
  const schema = schemaRead(datamodel)
  const { parse: parseArray } = require('postgres-array')
  const pool = withNamesAsText(new pg.Pool(poolConfig(databaseUrl(datamodel))), parseArray)
  const connect = pool.connect.bind(pool)
  // node-postgres' own Pool.query calls connect with a callback: leave that path alone.
  pool.connect = (...args) => (args.length
    ? connect(...args)
    : connect().then((client) => withNamesAsText(client, parseArray)))
  const logQueries = Boolean(process.env.LOG_QUERIES)
  const engine = new runtime.QueryEngine(
    { datamodel, logLevel: logQueries ? 'info' : 'error', logQueries },
    (line) => process.stderr.write(`${line}\n`),
    bindAdapter(new PrismaPg(pool)),
  )
  await engine.connect('{}')
  return { engine, schema, pool }
}

function readBody(request) {
  return new Promise((resolve, reject) => {
    const chunks = []
    request.on('data', (chunk) => chunks.push(chunk))
    request.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    request.on('error', reject)
  })
}

async function route({ engine, schema }, request, body) {
  const url = request.url.split('?')[0]
  if (request.method === 'GET' && url === '/status') return { status: 'ok' }
  if (request.method === 'GET' && url === '/metrics') return {}
  if (request.method === 'POST' && url === '/') {
    const txId = request.headers['x-transaction-id']
    const { body: query, operations } = translate(body, schema)
    return translateAnswer(await engine.query(query, '{}', txId || undefined), operations)
  }
  if (request.method === 'POST' && url === '/transaction/start') {
    return JSON.parse(await engine.startTransaction(body || '{}', '{}'))
  }
  const tx = /^\/transaction\/([^/]+)\/(commit|rollback)$/.exec(url)
  if (request.method === 'POST' && tx) {
    const [, id, verb] = tx
    const text = verb === 'commit'
      ? await engine.commitTransaction(id, '{}')
      : await engine.rollbackTransaction(id, '{}')
    return JSON.parse(text || '{}')
  }
  return null
}

async function main() {
  const port = Number(option('-p') || option('--port') || 4466)
  const state = await engineStart()
  const server = http.createServer(async (request, response) => {
    try {
      const result = await route(state, request, await readBody(request))
      if (result === null) {
        response.writeHead(404).end()
        return
      }
      response.writeHead(200, { 'content-type': 'application/json' })
      response.end(JSON.stringify(result))
    } catch (error) {
      process.stderr.write(`prisma engine: ${error.stack || error}\n`)
      response.writeHead(500, { 'content-type': 'text/plain' }).end(String(error.message || error))
    }
  })
  server.keepAliveTimeout = 60_000
  server.listen(port, '127.0.0.1')
  const shutdown = async () => {
    server.close()
    await state.engine.disconnect('{}').catch(() => {})
    await state.pool.end().catch(() => {})
    process.exit(0)
  }
  process.on('SIGINT', shutdown)
  process.on('SIGTERM', shutdown)
}

if (process.argv[1] && import.meta.url === new URL(`file://${fs.realpathSync(process.argv[1])}`).href) {
  main().catch((error) => {
    process.stderr.write(`prisma engine: ${error.stack || error}\n`)
    process.exit(1)
  })
}
