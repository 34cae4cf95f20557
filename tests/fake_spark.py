"""A few rows of Python dicts behind the part of the PySpark DataFrame API that evaluation's
aggregations use (significance.py's signed ranks and moments, seeds.py's pooling, evaluate.py's
input checks), so that the fast tier runs their arithmetic without a Spark session.

Only what those functions call is here, with Spark's semantics for it: SQL nulls (None) propagate
through arithmetic and comparisons, ``&`` is three-valued, ``when`` without ``otherwise`` is null
where its condition is not true, aggregates skip nulls (``count`` of nothing is 0, ``sum``/``avg``
/``min``/``max`` of nothing null, ``var_pop`` over n, ``stddev_samp`` over n - 1 and null for one
value), a global ``agg`` gives one row even of no rows, structs order field by field with null
first, and a window sums its frame (null for an empty one). Everything is evaluated row by row on
a handful of rows: a stand-in for the arithmetic, not for Spark's planning or performance. The
Spark-marked tests run the same functions on a real session.

``install(monkeypatch)`` puts it in place of ``pyspark.sql.functions`` and ``pyspark.sql.Window``
for one test; ``DataFrame(rows)`` is a frame of dicts.
"""

from __future__ import annotations

import builtins
import math
import operator


def _null_safe(op):
    return lambda a, b: None if a is None or b is None else op(a, b)


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _and(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _order_key(v):
    """Spark's ordering of a value (nulls first; structs field by field)."""
    if isinstance(v, Struct):
        return tuple(_order_key(x) for x in v.values())
    return (v is not None, v)


class Struct(dict):
    """A struct value: its fields by name, in order."""


class Column:
    """A row expression: ``fn(rows, i)`` is its value at row i of ``rows`` (the whole frame, which
    a window needs). ``explode``: a generator (one output row per element)."""

    def __init__(self, fn, name: str = "col", explode: bool = False):
        self.fn, self.name, self.explode = fn, name, explode

    def __call__(self, rows, i):
        return self.fn(rows, i)

    def alias(self, name: str) -> Column:
        return Column(self.fn, name, self.explode)

    def _bin(self, other, op, reverse=False):
        o = _col_or_lit(other)
        if reverse:
            return Column(lambda rows, i: op(o(rows, i), self(rows, i)))
        return Column(lambda rows, i: op(self(rows, i), o(rows, i)))

    def __add__(self, o):
        return self._bin(o, _null_safe(operator.add))

    def __radd__(self, o):
        return self._bin(o, _null_safe(operator.add), True)

    def __sub__(self, o):
        return self._bin(o, _null_safe(operator.sub))

    def __rsub__(self, o):
        return self._bin(o, _null_safe(operator.sub), True)

    def __mul__(self, o):
        return self._bin(o, _null_safe(operator.mul))

    def __rmul__(self, o):
        return self._bin(o, _null_safe(operator.mul), True)

    def __truediv__(self, o):
        return self._bin(o, _div)

    def __rtruediv__(self, o):
        return self._bin(o, _div, True)

    def __gt__(self, o):
        return self._bin(o, _null_safe(operator.gt))

    def __lt__(self, o):
        return self._bin(o, _null_safe(operator.lt))

    def __ge__(self, o):
        return self._bin(o, _null_safe(operator.ge))

    def __le__(self, o):
        return self._bin(o, _null_safe(operator.le))

    def __eq__(self, o):  # a Column, as PySpark's
        return self._bin(o, _null_safe(operator.eq))

    def __ne__(self, o):
        return self._bin(o, _null_safe(operator.ne))

    __hash__ = None

    def __and__(self, o):
        return self._bin(o, _and)

    def __invert__(self):
        return Column(lambda rows, i: None if self(rows, i) is None else not self(rows, i))

    def isNotNull(self):  # PySpark's names
        return Column(lambda rows, i: self(rows, i) is not None)

    def isNull(self):
        return Column(lambda rows, i: self(rows, i) is None)

    def isin(self, values):
        values = list(values)
        return Column(lambda rows, i: None if self(rows, i) is None else self(rows, i) in values)

    def cast(self, kind: str):
        to = {"long": int, "int": int, "double": float, "string": str,
              "boolean": bool}[kind]
        return Column(lambda rows, i: None if self(rows, i) is None else to(self(rows, i)),
                      self.name)


def _col_or_lit(x) -> Column:
    return x if isinstance(x, Column) else lit(x)


def _col_or_name(x) -> Column:
    return x if isinstance(x, Column) else col(x)


def col(name: str) -> Column:
    """A column; ``a.b`` is field b of struct column a."""
    path = name.split(".")

    def get(rows, i):
        v = rows[i][path[0]]
        for p in path[1:]:
            v = None if v is None else v[p]
        return v

    return Column(get, path[-1])


def lit(value) -> Column:
    return Column(lambda rows, i: value, str(value))


def when(cond: Column, value) -> Column:
    v = _col_or_lit(value)
    return Column(lambda rows, i: v(rows, i) if cond(rows, i) is True else None)


def coalesce(*cols) -> Column:
    cs = [_col_or_name(c) for c in cols]
    return Column(lambda rows, i: next((v for v in (c(rows, i) for c in cs) if v is not None),
                                       None))


def abs(c) -> Column:  # PySpark's names shadow builtins here: the module uses ``builtins.``
    c = _col_or_name(c)
    return Column(lambda rows, i: None if c(rows, i) is None else builtins.abs(c(rows, i)),
                  c.name)


def struct(*cols) -> Column:
    cs = [_col_or_name(c) for c in cols]
    return Column(lambda rows, i: Struct((c.name, c(rows, i)) for c in cs), "struct")


def array(*cols) -> Column:
    cs = [_col_or_name(c) for c in cols]
    return Column(lambda rows, i: [c(rows, i) for c in cs], "array")


def explode(c: Column) -> Column:
    return Column(c.fn, "col", explode=True)


class Aggregate:
    """An aggregate: ``fn(values)`` over the non-null values of its column in a group (or over a
    window's frame, with ``over``)."""

    def __init__(self, column: Column, fn, name: str):
        self.column, self.fn, self.name = column, fn, name

    def alias(self, name: str) -> Aggregate:
        return Aggregate(self.column, self.fn, name)

    def of(self, rows: list[dict]):
        return self.fn([v for v in (self.column(rows, i) for i in range(len(rows)))
                        if v is not None])

    def over(self, spec: WindowSpec) -> Column:
        def value(rows, i):
            mine = [r for r in rows if all(col(k)([r], 0) == col(k)(rows, i)
                                           for k in spec.partition)]
            mine.sort(key=lambda r: tuple(_order_key(col(k)([r], 0)) for k in spec.order))
            at = next(j for j, r in enumerate(mine) if r is rows[i])
            lo = 0 if spec.start is None else builtins.max(0, at + spec.start)
            hi = len(mine) - 1 if spec.end is None else at + spec.end
            return self.of(mine[lo:hi + 1]) if lo <= hi else self.of([])

        return Column(value, self.name)


def _mean(v):
    return builtins.sum(v) / len(v) if v else None


def count(c) -> Aggregate:
    return Aggregate(_col_or_name(c), len, "count")


def sum(c) -> Aggregate:
    return Aggregate(_col_or_name(c), lambda v: builtins.sum(v) if v else None, "sum")


def avg(c) -> Aggregate:
    return Aggregate(_col_or_name(c), _mean, "avg")


def min(c) -> Aggregate:
    return Aggregate(_col_or_name(c), lambda v: builtins.min(v, key=_order_key) if v else None,
                     "min")


def max(c) -> Aggregate:
    return Aggregate(_col_or_name(c), lambda v: builtins.max(v, key=_order_key) if v else None,
                     "max")


def var_pop(c) -> Aggregate:
    def var(v):
        if not v:
            return None
        m = _mean(v)
        return math.fsum((x - m) ** 2 for x in v) / len(v)

    return Aggregate(_col_or_name(c), var, "var_pop")


def stddev_samp(c) -> Aggregate:
    def sd(v):
        if len(v) < 2:
            return None
        m = _mean(v)
        return math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))

    return Aggregate(_col_or_name(c), sd, "stddev_samp")


class WindowSpec:
    def __init__(self, partition=(), order=(), start=None, end=None):
        self.partition, self.order, self.start, self.end = list(partition), list(order), start, end

    def orderBy(self, *cols):
        return WindowSpec(self.partition, cols, self.start, self.end)

    def rowsBetween(self, start, end):
        return WindowSpec(self.partition, self.order, start, end)


class Window:
    unboundedPreceding = None  # PySpark's names
    unboundedFollowing = None
    currentRow = 0

    @staticmethod
    def partitionBy(*cols):
        return WindowSpec(cols)


class DataFrame:
    """A frame of dict rows (every row with the same keys)."""

    def __init__(self, rows: list[dict], columns: list[str] | None = None):
        self.rows = [dict(r) for r in rows]
        self.columns = list(columns if columns is not None else (rows[0] if rows else []))

    def filter(self, cond: Column) -> DataFrame:
        return DataFrame([r for i, r in enumerate(self.rows) if cond(self.rows, i) is True],
                         self.columns)

    def select(self, *cols) -> DataFrame:
        cs = [_col_or_name(c) for c in cols]
        out = []
        for i in range(len(self.rows)):
            row = [{}]
            for c in cs:
                v = c(self.rows, i)
                if c.explode:
                    row = [{**r, c.name: x} for r in row for x in (v or [])]
                else:
                    for r in row:
                        r[c.name] = v
            out += row
        return DataFrame(out, [c.name for c in cs])

    def withColumn(self, name: str, c: Column) -> DataFrame:
        values = [c(self.rows, i) for i in range(len(self.rows))]
        return DataFrame([{**r, name: v} for r, v in zip(self.rows, values)],
                         [*[x for x in self.columns if x != name], name])

    def groupBy(self, *keys):
        frame = self

        class Grouped:
            def agg(self, *aggs):
                groups: dict[tuple, list[dict]] = {}
                for r in frame.rows:
                    groups.setdefault(tuple(r[k] for k in keys), []).append(r)
                return DataFrame([{**dict(zip(keys, g)), **{a.name: a.of(rs) for a in aggs}}
                                  for g, rs in groups.items()], [*keys, *[a.name for a in aggs]])

        return Grouped()

    def agg(self, *aggs) -> DataFrame:
        return DataFrame([{a.name: a.of(self.rows) for a in aggs}], [a.name for a in aggs])

    def collect(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def first(self) -> dict | None:
        return dict(self.rows[0]) if self.rows else None

    def persist(self) -> DataFrame:
        return self

    def unpersist(self) -> DataFrame:
        return self


def install(monkeypatch) -> None:
    """This module as ``pyspark.sql.functions`` and its ``Window`` as ``pyspark.sql.Window`` (what
    ``from pyspark.sql import functions as F, Window`` inside the code then finds), for one test."""
    import sys

    import pyspark.sql

    monkeypatch.setattr(pyspark.sql, "functions", sys.modules[__name__])
    monkeypatch.setattr(pyspark.sql, "Window", Window)
