"""PromQL, as far as check_monitoring.py needs it: the metric names and
labels an expression uses, from a small tokenizer (not a full parser),
checked on a few expressions by self_test()."""
import re
import sys


# Words that are PromQL's own (operators, modifiers, aggregations), never a
# metric even when not followed by '('.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "start", "end", "inf", "nan",
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
   |(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
   |(?P<var>\$\{[^}]*\}|\$\w+)                 # a Grafana variable
   |(?P<range>\[[^\]]*\])                       # a range or subquery: [5m], [$__rate_interval]
   |(?P<dur>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
   |(?P<num>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
   |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
   |(?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=(){},@])
    """,
    re.X,
)


class PromQLError(Exception):
    pass


def tokens(expr):
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise PromQLError(f"cannot read {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def parse(expr):
    """The expression's vector selectors, as (metric, {label: (op, value)}),
    and the label names of its by/without/on/ignoring/group_* lists."""
    toks = tokens(expr)
    selectors, grouping = [], set()
    depth = 0
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth < 0:
                raise PromQLError("unbalanced ')'")
        elif text in ("{", "}"):
            raise PromQLError("a label matcher without a metric name")
        elif kind == "ident" and text in GROUPING:
            if nxt == "(":
                j = i + 2
                while j < len(toks) and toks[j][1] != ")":
                    if toks[j][0] == "ident":
                        grouping.add(toks[j][1])
                    j += 1
                if j == len(toks):
                    raise PromQLError(f"unclosed {text} (...)")
                i = j
        elif kind == "ident" and text not in KEYWORDS and nxt != "(":
            matchers = {}
            if nxt == "{":
                j = i + 2
                while j < len(toks) and toks[j][1] != "}":
                    if toks[j][1] == ",":
                        j += 1
                        continue
                    if (j + 2 >= len(toks) or toks[j][0] != "ident" or
                            toks[j + 1][1] not in ("=", "!=", "=~", "!~") or
                            toks[j + 2][0] != "str"):
                        raise PromQLError(f"a malformed matcher after {text}")
                    matchers[toks[j][1]] = (toks[j + 1][1], toks[j + 2][1][1:-1])
                    j += 3
                if j == len(toks):
                    raise PromQLError(f"unclosed {{ after {text}")
                i = j
            selectors.append((text, matchers))
        i += 1
    if depth != 0:
        raise PromQLError("unbalanced '('")
    return selectors, grouping


def self_test():
    cases = {
        "histogram_quantile(0.99, sum by (le, grpc_method) ("
        'rate(grpc_server_handling_seconds_bucket{node=~"$node", grpc_type="unary"}'
        "[$__rate_interval])))": (
            {"grpc_server_handling_seconds_bucket"}, {"le", "grpc_method"}),
        "gpuexec_tls_certificate_expiry_timestamp_seconds - time() < 14 * 86400": (
            {"gpuexec_tls_certificate_expiry_timestamp_seconds"}, set()),
        "sum(rate(a_total[5m] offset 1h)) by (x) / on (instance) group_left(version) b_info": (
            {"a_total", "b_info"}, {"x", "instance", "version"}),
        'up{job="gpuexec-metrics"} == 0': ({"up"}, set()),
        'x{a="}{sum(y)", b!~`z`} and bool 1e3 > count without (c) (w)': ({"x", "w"}, {"c"}),
        "u / (v > 0) > 0.95": ({"u", "v"}, set()),
    }
    for expr, (names, labels) in cases.items():
        selectors, grouping = parse(expr)
        got = {s[0] for s in selectors}
        if got != names or grouping != labels:
            sys.exit(f"the PromQL tokenizer is wrong on {expr!r}: metrics {sorted(got)} "
                     f"(want {sorted(names)}), grouping {sorted(grouping)} (want {sorted(labels)})")
    for bad in ("sum(x", 'x{a="b"', "{a=\"b\"}", "x)"):
        try:
            parse(bad)
        except PromQLError:
            continue
        sys.exit(f"the PromQL tokenizer reads the malformed {bad!r}")
