"""Write the image's software bill of materials (CycloneDX JSON) to standard output.

Run inside the image build, from the repository root, with the tools venv: `sbom.py VENV
EXTRA`. Lists every Python
distribution installed in VENV (name, version, licence, PyPI purl) and every Debian package of the
base image (from dpkg's status file), so a scanner can match the image against advisories
without unpacking it.
"""

from __future__ import annotations

import os
import sys
import tomllib
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from cyclonedx.model import Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

DPKG_STATUS = Path("/var/lib/dpkg/status")


def python_components(venv: Path) -> list[Component]:
    """One component per distribution in the venv's site-packages."""
    (site,) = venv.glob("lib/python3*/site-packages")
    components = {}
    for dist in metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        licence = dist.metadata["License-Expression"]
        purl = PackageURL(type="pypi", name=name.lower(), version=dist.version)
        components[name.lower()] = Component(
            name=name,
            version=dist.version,
            type=ComponentType.LIBRARY,
            purl=purl,
            bom_ref=purl.to_string(),
            licenses=[LicenseExpression(licence)] if licence else [],
        )
    return [components[key] for key in sorted(components)]


def debian_components(status: Path = DPKG_STATUS) -> list[Component]:
    """One component per installed Debian package, read from dpkg's status file."""
    if not status.exists():
        return []
    components = []
    for stanza in status.read_text().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if "installed" not in fields.get("Status", ""):
            continue
        name, version = fields["Package"], fields["Version"]
        arch = fields.get("Architecture", "all")
        purl = PackageURL(
            type="deb", namespace="debian", name=name, version=version, qualifiers={"arch": arch}
        )
        components.append(
            Component(
                name=name,
                version=version,
                type=ComponentType.LIBRARY,
                purl=purl,
                bom_ref=purl.to_string(),
            )
        )
    return sorted(components, key=lambda c: c.name)


def main() -> None:
    venv, extra = Path(sys.argv[1]), sys.argv[2]
    # Reproducible: the build's date, and a serial number derived from the contents.
    when = datetime.fromtimestamp(int(os.environ.get("SOURCE_DATE_EPOCH", "0")), tz=UTC)
    bom = Bom(metadata=BomMetaData(timestamp=when))
    bom.metadata.component = Component(
        name="roundhouse",
        version=tomllib.loads(Path("pyproject.toml").read_text())["project"]["version"],
        type=ComponentType.CONTAINER,
        bom_ref=f"roundhouse-{extra}",
        properties=[Property(name="roundhouse:extra", value=extra)],
    )
    for component in python_components(venv) + debian_components():
        bom.components.add(component)
    listed = "\n".join(str(component.purl) for component in bom.components)
    bom.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, f"{extra}\n{listed}")
    sys.stdout.write(JsonV1Dot6(bom).output_as_string(indent=1) + "\n")


if __name__ == "__main__":
    main()
