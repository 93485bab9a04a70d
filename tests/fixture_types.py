"""Types of the shared fixtures in conftest.py, for test signatures (`def test_x(demo_image: DemoImage) -> None`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from builder.core.records import AcceptanceResult, BuiltImage, GateStatus, RenderedBuild, ResolvedSources
from builder.pins.model import Pins

DockerClient = Any  # docker.DockerClient (the SDK ships no type hints); builder.engine.client.Client
DemoImage = tuple[Pins, ResolvedSources, RenderedBuild, BuiltImage]
DemoAccepted = tuple[Pins, ResolvedSources, BuiltImage, AcceptanceResult]
BuildVariant = Callable[[str, int], BuiltImage]
ReportInputs = tuple[Pins, ResolvedSources, BuiltImage | None, AcceptanceResult | None]


class MakeReportInputs(Protocol):
    """conftest.report_inputs: records shaped like real ones (keyword overrides as in the fixture)."""

    def __call__(self, repository: str = ..., image_id: str = ..., statuses: dict[str, GateStatus | None] | None = ...,
                 acceptance: bool = ..., build: bool = ..., accepted_image: str | None = ...,
                 required: list[str] | None = ..., tags: tuple[str, ...] = ..., platform: str | None = ...
                 ) -> ReportInputs: ...
