"""Progress bars (tqdm) for long tuning work, and a no-op stand-in when they are off."""
from __future__ import annotations

import sys
from typing import Any


class _Quiet:
    def __enter__(self) -> "_Quiet":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


def bar(total: int, desc: str, unit: str = "it", enable: bool | None = None, leave: bool = True) -> Any:
    """A tqdm bar on stderr; `enable=None` shows it only when stderr is a terminal."""
    if enable is None:
        enable = sys.stderr.isatty()
    if not enable or total <= 0:
        return _Quiet()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Quiet()
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, dynamic_ncols=True)
