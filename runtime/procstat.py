"""Process measurements, standard library only and no relative imports: `deploycc bench` uses them, and
benchmarks/compare.py loads this file by path into peers' interpreters so every tool is measured alike."""
from __future__ import annotations

import sys


def peak_rss_bytes() -> int | None:
    """Peak resident set of this process. On Linux VmHWM: ru_maxrss survives execve, so a process started
    by a large parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # macOS reports bytes, Linux KiB
