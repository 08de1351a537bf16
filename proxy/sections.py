"""The base every config section is built on, and the device names sections share.

Each package owns the section of `config.toml` it reads (`proxy/engines/config.py`,
`trainer/config.py`, …); `proxy/config.py` assembles them into the root `Config`. This
module sits below all of them, so an owner imports its base without importing the root
(no cycle), and stays as light as pydantic: `areal-proxy --help` imports every section.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict

Device = Literal["cpu", "cuda", "npu"]
DEVICES: tuple[str, ...] = get_args(Device)
"""Where a model runs: the `[engine] device` and `[trainer] device` values, and the CLIs' `--device`."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


S = TypeVar("S", bound=Section)


def _false_is_off(value: object) -> object:
    return None if value is False else value


Strategy = Annotated[S | None, BeforeValidator(_false_is_off)]
"""An optional sub-section that turns a strategy on by being present (`[trainer.pods] keep = 4`);
absent, or set to `false` (`--set trainer.pods=false`, TOML has no null), it is off."""
