"""One kernel set for every size of a model's symbolic dims.

The kernels and the runner (runner.sources) are made from the general program
(apsat.pipeline.generalise) at the corners of two values per symbol and once more at a
third, every kernel keeping the tiles it has at the representative values. Token for token
the sources must agree; each number that differs (a loop bound, a stride, a buffer's dims,
a grid) is fitted as a polynomial in the symbols (apsat.lang.fit) and becomes:

- in a kernel's @triton.jit body, a new `tl.constexpr` parameter (S0, S1, ...), which the
  module's `constexprs(sz)` computes from the sizes `sz` (symbol -> value); its grid
  `grid(sz)` is GRID_KEYS's ceil(size / tile) over those, never fitted (a grid can stay
  the same at every probe and still change past a tile); Triton compiles a kernel once
  per distinct size and caches it, as torch.compile's per-size specialisation does,
  while the source stays one;
- in the runner, an expression of `sz`, which run() reads off its inputs' shapes
  (`SYMBOLS`: symbol -> (tensor, axis)).

`general_sources` raises NotGeneral naming the file where the sources differ in more
than numbers (a tile that the size decided, a helper that changed). The CUDA C builds
(kernels/<name>.cubin) stay those of the representative sizes: the runner refuses them at
another size.
"""
from __future__ import annotations

import io
import re
import tokenize

from apsat.lang.dims import NotGeneral, is_prime
from apsat.lang.fit import FitError, corners, fit, text


def general_sources(graph_at, symbols: dict[str, tuple[int, int, int]], signature: dict,
                    generated: dict | None = None) -> dict[str, str]:
    """Relative path -> text, as runner.sources gives, for every size: `graph_at(values,
    tiles)` lowers the general program at `values` (tiles: kernel name -> tiles, or None
    for the representative's own choice); `symbols`: name -> (representative, other,
    third value); `signature`: the model's input dims (ints and symbol names);
    `generated`: tensors the runner makes at each size, name -> (start, delta, length as
    [(symbol names, coefficient), ...]): a Range of symbolic length."""
    from apsat.backends.gpu.runner import sources

    points = corners(symbols)
    base = graph_at(points[0][1], None)
    tiles = {k.name: dict(k.tiles) for k in base.kernels}
    versions = [sources(base)] + [sources(graph_at(values, tiles)) for _, values in points[1:]]
    third_values = {n: v[2] for n, v in symbols.items()}
    third = sources(graph_at(third_values, tiles))
    far_values, far = _far(graph_at, tiles, symbols)
    rep = points[0][1]
    out = {}
    for rel, base_text in versions[0].items():
        texts = [v.get(rel) for v in versions] + [third.get(rel)]
        if any(t is None for t in texts):
            raise NotGeneral(f"gpu kernels: {rel} exists at some sizes only")
        numbers = _differing(rel, texts, points, third_values)
        if far is not None:
            _confirm(rel, base_text, far.get(rel), numbers, far_values)
        if rel.startswith("kernels/"):
            out[rel] = _kernel(base_text, numbers, rel, rep)
        elif rel == "runner.py":
            out[rel] = _runner(base_text, numbers, rep, signature, generated or {})
        elif numbers:
            raise NotGeneral(f"gpu kernels: {rel} changes with the symbolic dims")
        else:
            out[rel] = base_text
    return out


# A last check lowers the program with every symbol past this (and every tile), so that
# code that only holds while a size fits in one tile (a grid of one block, a row in one
# chunk) is found: the probes near the representative would all agree on it.
FAR = 257


def _far(graph_at, tiles: dict, symbols: dict):
    """(values, sources) with the symbols at the largest distinct primes at most FAR, or
    below where the program does not hold there (a sequence past the position table),
    above their representatives; (None, None) when no such size holds."""
    from apsat.backends.gpu.runner import sources
    from apsat.errors import ShapeError

    top = max(v[0] for v in symbols.values())
    primes = [p for p in range(FAR, top, -1) if is_prime(p)]
    for i in range(0, len(primes), 2):
        # each symbol its own prime: two symbols of one value (past = sequence) let the
        # index expressions simplify into another form, which is not a change of code
        values = {n: max(primes[min(i + k, len(primes) - 1)], v[0] + 1 + k)
                  for k, (n, v) in enumerate(symbols.items())}
        try:
            return values, sources(graph_at(values, tiles))
        except ShapeError:
            continue
    return None, None


def _confirm(rel: str, base: str, far: str | None, numbers: dict, far_values: dict) -> None:
    """The sources at `far_values` are the same code, and each fitted size gives there
    what they hold (a grid aside: grid(sz) computes it); NotGeneral otherwise."""
    from apsat.lang.fit import value

    if far is None:
        raise NotGeneral(f"gpu kernels: {rel} is not made at large sizes")
    a, b = _tokens(base), _tokens(far)
    if len(a) != len(b) or any(x.string != y.string and not (x.type == y.type and x.type in
                                                              (tokenize.NUMBER, tokenize.STRING))
                               for x, y in zip(a, b)):
        raise NotGeneral(f"gpu kernels: {rel} is other code once a symbolic dim is past its tiles")
    for x, y in zip(a, b):
        if x.type == tokenize.NUMBER and x.string != y.string and not x.line.startswith(("GRID = ", "CUDA_LAUNCH = ")):
            found = numbers.get(x.start)
            if found is None or isinstance(found[1], _Ceiling) or value(found[1], far_values) != float(y.string):
                raise NotGeneral(f"gpu kernels: {rel} line {x.start[0]}: a size that the probes did not "
                                 f"predict at large sizes ({x.string} becomes {y.string})")


def _tokens(source: str) -> list:
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def _differing(rel: str, texts: list[str], points, third_values) -> dict:
    """(row, col) of each number token of the first text that differs among `texts` ->
    its polynomial; NotGeneral where anything else differs (the runner's KEY aside)."""
    streams = [_tokens(t) for t in texts]
    if len({len(s) for s in streams}) != 1:
        raise NotGeneral(f"gpu kernels: {rel} is not the same code at every size")
    spots, samples = [], []
    for i, tok in enumerate(streams[0]):
        others = [s[i] for s in streams]
        if all(o.string == tok.string for o in others):
            continue
        if tok.type == tokenize.STRING and tok.line.startswith("KEY = "):
            continue                                   # the runner's content hash
        if tok.type != tokenize.NUMBER or any(o.type != tokenize.NUMBER for o in others):
            raise NotGeneral(f"gpu kernels: {rel} line {tok.start[0]} changes with the symbolic dims "
                             f"({tok.string!r} against {others[1].string!r})")
        spots.append(tok)
        samples.append([float(o.string) for o in others])
    out = {}
    for tok, sample in zip(spots, samples):    # each on its own: a grid is a ceiling division
        try:
            (poly,) = fit([[v] for v in sample[:-1]], points, [sample[-1]], third_values)
        except FitError:
            poly = _Ceiling(sample)
        out[tok.start] = (tok, poly)
    return out


class _Ceiling:
    """A number that is no polynomial (a grid's ceil(size / tile), which grid(sz) computes
    from GRID_KEYS instead): its value per version."""

    def __init__(self, sample):
        self.sample = [int(v) for v in sample]


def _python(poly: dict) -> str:
    return "(" + text(poly, lambda s: f"sz[{s!r}]") + ")"


def _replace(source: str, edits: dict) -> str:
    """`source` with the token at each (row, col) of `edits` replaced by its text."""
    lines = source.splitlines(keepends=True)
    for (row, col), (tok, new) in sorted(edits.items(), reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[tok.end[1]:]
    return "".join(lines)


def _kernel(source: str, numbers: dict, rel: str, rep: dict) -> str:
    """A kernel module whose sizes are constexpr parameters computed from `sz`."""
    lines = source.splitlines()
    name = rel.split("/")[-1][:-3]
    head = next(i for i, l in enumerate(lines) if l.startswith(f"def {name}("))
    tail = next(i for i, l in enumerate(lines) if l.startswith("CONSTEXPRS = "))
    names: dict = {}
    edits = {}
    for (row, col), (tok, poly) in numbers.items():
        if lines[row - 1].startswith("GRID = "):
            continue                                     # grid(sz) computes it from GRID_KEYS
        if isinstance(poly, _Ceiling):
            raise NotGeneral(f"gpu kernels: {rel} line {row}: a size that is not a polynomial in the symbols")
        if head < row - 1 < tail:                        # in the @triton.jit body
            key = tuple(sorted((tuple(sorted(s)), c) for s, c in poly.items()))
            names.setdefault(key, (f"S{len(names)}", poly))
            edits[(row, col)] = (tok, names[key][0])
        elif row - 1 >= tail and lines[row - 1].startswith("CONSTEXPRS = "):
            edits[(row, col)] = (tok, _python(poly))
        else:
            raise NotGeneral(f"gpu kernels: {rel} line {row}: a size outside the kernel and its launch")
    lines = _replace(source, edits).splitlines()
    extra = "".join(f", {n}: tl.constexpr" for n, _ in names.values())
    lines[head] = lines[head][:-2] + extra + "):"
    out = []
    for line in lines:
        if line.startswith("CONSTEXPRS = "):
            sized = line[len("CONSTEXPRS = "):-1] + "".join(f", {n!r}: {_python(p)}" for n, p in names.values()) + "}"
            out += [f"REPRESENTATIVE = {rep!r}", "", "", "def constexprs(sz):",
                    "    \"\"\"The constexpr parameters at sizes `sz` (symbol -> value).\"\"\"",
                    f"    return {sized}", "", "", "CONSTEXPRS = constexprs(REPRESENTATIVE)"]
        elif line.startswith("SIGNATURE = "):
            out.append(line[:-1] + "".join(f", {n!r}: 'constexpr'" for n, _ in names.values()) + "}")
        elif line.startswith("GRID = "):
            out += ["def grid(sz):",
                    "    \"\"\"The launch grid at sizes `sz`: GRID_KEYS over constexprs(sz).\"\"\"",
                    "    c = constexprs(sz)",
                    "    return tuple(-(-c[k[0]] // c[k[1]]) if len(k) == 2 else c[k[0]] for k in GRID_KEYS)",
                    "", "", line]
        elif line.startswith("def launch("):
            out.append(line[:-2] + ", sz=None):")
        elif "[GRID](" in line:
            out.append(line.replace("[GRID](", "[grid(sz or REPRESENTATIVE)](")
                       .replace("**CONSTEXPRS", "**constexprs(sz or REPRESENTATIVE)"))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


_RUN_START = "    raw = _raw(tensors, PER_CALL)\n"


def _runner(source: str, numbers: dict, rep: dict, signature: dict, generated: dict) -> str:
    """The runner with buffer dims as expressions of sizes read off the inputs."""
    run_at = source.index("\ndef run(")
    run_end = source.index("\ndef capture(")
    inputs_line = next(i for i, l in enumerate(source.splitlines()) if l.startswith("INPUTS = "))
    offsets = _line_offsets(source)
    edits = {}
    for (row, col), (tok, poly) in numbers.items():
        if tok.line.startswith("CUDA_LAUNCH = "):
            continue                                     # the CUDA C builds: representative sizes
        if isinstance(poly, _Ceiling):
            raise NotGeneral(f"gpu kernels: runner.py line {row}: a size that is not a polynomial in the symbols")
        at = offsets[row - 1] + col
        if run_at < at < run_end:
            edits[(row, col)] = (tok, _python(poly))
        elif row - 1 == inputs_line:
            edits[(row, col)] = (tok, "None")            # checked against sz in _input
        else:
            raise NotGeneral(f"gpu kernels: runner.py line {row}: a size outside run()")
    out = _replace(source, edits)
    run_at = out.index("\ndef run(")
    start = out.index(_RUN_START, run_at)
    body_end = out.index("\ndef capture(")
    body = re.sub(r"(    _launch\(.*)\)\n", r"\1, sz=sz)\n", out[start:body_end])
    out = (out[:start] + "    sz = _sizes(tensors)\n    tensors = {**_generated(sz), **tensors}\n"
           + body + out[body_end:])
    out = out.replace("def _launch(name, device, kernels, *args):",
                      "def _launch(name, device, kernels, *args, sz=None):")
    out = out.replace("mod.launch(*args)", "mod.launch(*args, sz=sz)")
    out = out.replace("        _cubin(name)(*args)\n",
                      "        if sz not in (None, REPRESENTATIVE):\n"
                      "            raise RuntimeError(\"the CUDA C builds are for the representative sizes %s, not %s\"\n"
                      "                               % (REPRESENTATIVE, sz))\n"
                      "        _cubin(name)(*args)\n")
    out = out.replace("    if tuple(t.shape) != tuple(dims):",
                      "    if len(t.shape) != len(dims) or any(d is not None and a != d for a, d in zip(t.shape, dims)):")
    where = {}
    for tensor, dims in signature.items():
        for axis, d in enumerate(dims):
            if isinstance(d, str) and d in rep:
                where.setdefault(d, (tensor, axis))
    missing = sorted(set(rep) - set(where))
    if missing:
        raise NotGeneral(f"gpu kernels: symbolic dims {missing} are declared by no input")
    sizes = (f"REPRESENTATIVE = {rep!r}\nSYMBOLS = {where!r}   # symbol -> (input tensor, axis)\n"
             f"GENERATED = {generated!r}   # tensor -> (start, delta, length): a Range per size\n\n\n"
             "def _sizes(tensors):\n"
             "    \"\"\"Each symbolic dim's value, read off the inputs' shapes.\"\"\"\n"
             "    return {s: int(tensors[t].shape[a]) for s, (t, a) in SYMBOLS.items()}\n\n\n"
             "def _generated(sz):\n"
             "    \"\"\"The Ranges of symbolic length the program reads, at sizes `sz`.\"\"\"\n"
             "    import math\n\n"
             "    import torch\n\n"
             "    out = {}\n"
             "    for name, (start, delta, length) in GENERATED.items():\n"
             "        n = sum(c * math.prod(sz[s] for s in names) for names, c in length)\n"
             "        out[name] = start + delta * torch.arange(n, dtype=torch.float32)\n"
             "    return out\n\n\n")
    at = out.index("def _device(")
    return out[:at] + sizes + out[at:]


def _line_offsets(source: str) -> list[int]:
    out, total = [], 0
    for line in source.splitlines(keepends=True):
        out.append(total)
        total += len(line)
    return out
