"""Offset pagination shared by every listing page (runs, tests, a plan's selection)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pager:
    """One page of a longer listing (offset pagination; page numbers start at 1)."""

    page: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page

    @property
    def has_prev(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page < self.pages
