"""A compact set of ranks: a bitmap, so 4,096 ranks cost 512 bytes in memory and ~1 KiB serialized."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema


class RankSet:
    """Ranks as the set bits of one integer; serialized as a hex string (JSON has no big integers)."""

    __slots__ = ("bits",)

    def __init__(self, ranks: Iterable[int] = (), *, bits: int = 0) -> None:
        self.bits = bits
        for rank in ranks:
            self.add(rank)

    def add(self, rank: int) -> None:
        if rank >= 0:
            self.bits |= 1 << rank

    def update(self, other: RankSet) -> None:
        self.bits |= other.bits

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and rank >= 0 and bool(self.bits >> rank & 1)

    def __len__(self) -> int:
        return self.bits.bit_count()

    def __bool__(self) -> bool:
        return self.bits != 0

    def __iter__(self) -> Iterator[int]:
        bits, base = self.bits, 0
        while bits:
            low = bits & -bits
            index = low.bit_length() - 1
            yield base + index
            bits ^= low

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RankSet) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __repr__(self) -> str:
        return f"RankSet({self.ranges()})"

    def copy(self) -> RankSet:
        return RankSet(bits=self.bits)

    def ranges(self) -> str:
        """'0-36,38-63': how a person reads a set of ranks."""
        parts: list[str] = []
        start = prev = None
        for rank in self:
            if prev is not None and rank == prev + 1:
                prev = rank
                continue
            if start is not None:
                parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = rank
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        return ",".join(parts)

    def to_hex(self) -> str:
        return format(self.bits, "x")

    @classmethod
    def from_hex(cls, text: str) -> RankSet:
        return cls(bits=int(text, 16) if text else 0)

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: object, _handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(value: object) -> RankSet:
            if isinstance(value, RankSet):
                return value
            if isinstance(value, str):
                return cls.from_hex(value)
            if isinstance(value, list):
                return cls(int(v) for v in value)
            raise ValueError("a rank set is a hex bitmap string or a list of ranks")

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(RankSet.to_hex)
        )
