"""Kubernetes resource quantities ("500m", "256Mi", "1.5G", "2"), parsed for bounds checks."""

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator

# The Kubernetes quantity grammar without a sign (negative limits make no sense here).
_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str) -> Decimal:
    """The value of a quantity in base units (cores, bytes); ValueError when malformed."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a resource quantity (examples: 500m, 256Mi, 2)")
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(2) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def valid_quantity(text: str) -> str:
    """`text` itself when it is a quantity; ValueError otherwise."""
    parse_quantity(text)
    return text


# A setting or field that must hold a quantity.
Quantity = Annotated[str, AfterValidator(valid_quantity)]


def smaller_quantity(first: str, second: str) -> str:
    """The smaller of two quantities, as written (the first when they are equal)."""
    return first if parse_quantity(first) <= parse_quantity(second) else second


def byte_quantity(value: Decimal | int) -> str:
    """Bytes as a quantity: in Mi when whole mebibytes, else plain bytes."""
    whole = int(value)
    return f"{whole >> 20}Mi" if whole % (1 << 20) == 0 else str(whole)


def added_quantities(first: str, second: str) -> str:
    """The sum of two byte quantities (memory), as byte_quantity writes it."""
    return byte_quantity(parse_quantity(first) + parse_quantity(second))


@dataclass(frozen=True)
class QuantityBounds:
    """Inclusive bounds for one kind of resource quantity, checked in Python and in CEL."""

    minimum: str
    maximum: str

    def check(self, text: str) -> str:
        value = parse_quantity(text)
        if not parse_quantity(self.minimum) <= value <= parse_quantity(self.maximum):
            raise ValueError(f"{text!r} is outside {self.minimum}..{self.maximum}")
        return text

    def cel_rule(self) -> str:
        # int-or-string fields: `string(self)` turns `cpu: 1` into "1" as Kubernetes does.
        quantity = "quantity(string(self))"
        return (
            f"isQuantity(string(self)) && {quantity}.compareTo(quantity('{self.minimum}')) >= 0"
            f" && {quantity}.compareTo(quantity('{self.maximum}')) <= 0"
        )
