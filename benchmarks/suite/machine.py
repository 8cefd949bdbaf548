"""What a benchmark run records about the machine: the CPU's name and the installed versions of the packages."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Optional


def package_version(distribution: str) -> Optional[str]:
    """The installed version of `distribution`, or None where it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module reports."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
