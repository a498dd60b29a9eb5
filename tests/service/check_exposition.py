#!/usr/bin/python3
"""Checks a Prometheus text exposition (stdin) against the format.

Parses it with the Prometheus project's own Python parser
(prometheus_client), then checks what that parser lets through: one TYPE
per family, declared before its samples; no sample twice; counter samples
end in _total; histogram buckets cumulative, ending in le="+Inf" equal to
_count. Exit status 0 when it conforms; otherwise each problem on stderr.
"""
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def check(text):
    problems = []
    if not text.endswith("\n"):
        problems.append("the exposition does not end with a newline")
    families = list(text_string_to_metric_families(text))  # raises on bad syntax
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in types:
                problems.append(f"TYPE of {name} declared twice")
            types[name] = kind
        elif line and not line.startswith("#"):
            sample = re.split(r"[{ ]", line, 1)[0]
            base = re.sub(r"_(bucket|sum|count)$", "", sample)
            if sample not in types and base not in types:
                problems.append(f"sample {sample} comes before its TYPE")
    seen = set()
    for family in families:
        if not NAME.match(family.name):
            problems.append(f"bad metric name {family.name!r}")
        buckets = {}
        counts = {}
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                problems.append(f"sample {s.name}{s.labels} appears twice")
            seen.add(key)
            for label in s.labels:
                if not LABEL.match(label):
                    problems.append(f"bad label name {label!r} in {s.name}")
            if family.type == "counter" and not s.name.endswith(("_total", "_created")):
                problems.append(f"counter sample {s.name} does not end in _total")
            if family.type == "counter" and s.value < 0:
                problems.append(f"counter {s.name}{s.labels} is negative")
            if family.type == "histogram":
                rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                if s.name.endswith("_bucket"):
                    buckets.setdefault(rest, []).append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    counts[rest] = s.value
        for rest, series in buckets.items():
            bounds = [b for b, _ in series]
            values = [v for _, v in series]
            if bounds != sorted(bounds):
                problems.append(f"{family.name}{dict(rest)}: buckets out of order")
            if any(b > a for a, b in zip(values[1:], values)):
                problems.append(f"{family.name}{dict(rest)}: buckets not cumulative")
            if not math.isinf(bounds[-1]):
                problems.append(f"{family.name}{dict(rest)}: no le=\"+Inf\" bucket")
            elif counts.get(rest) != values[-1]:
                problems.append(f"{family.name}{dict(rest)}: +Inf bucket != _count")
    return families, problems


def main():
    text = sys.stdin.read()
    try:
        families, problems = check(text)
    except ValueError as e:
        print(f"not in the Prometheus text format: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(families)} families, "
          f"{sum(len(f.samples) for f in families)} samples: conforms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
