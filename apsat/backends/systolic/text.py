"""The stream's text form: one declaration or instruction a line; `parse(to_text(s))`
rebuilds an equal Stream (tests check it round-trips).

    ; apsat systolic stream v1
    .accel rows=32 cols=32 dataflow=os ifmap_kb=64 filter_kb=64 ofmap_kb=64 dram_bandwidth=64.0 vector_lanes=32 name="32x32" flex_slack=0.1 operand_bytes=1
    .buffer x0 input 1x3x224x224 "data_0"          (weight buffers alike; temp: no tensor;
    .buffer c0 const - 0.5                          const: its value; `-` is a scalar)
    .view v3 x0 |windows 3x3x3/1x2x2/1x1x1@1 |reshape 12321x27
    .group L0 gemm "systolic-array" m=12321 k=27 n=64 a_mode=resident df=os
                                                    (vcols=232: columns on the vector unit)
    .output "softmaxout_1" v99
    .opaque "key" {json: the ONNX node, base64}
    .options im2col=model fold_copies=0 fuse_zips=0 (the lowering options)
    .init                                           (instructions run once at load time)
    .main                                           (instructions run per inference)
    LOAD ifmap@0:1x150528 <- v0[0:1,0:150528] words=150528 tag=L0
    PRELOAD filter@0:27x32[0:27,0:32] tag=L0
    MATMUL ofmap@0:1024x32[0:32,0:32] <- ifmap@0:1x150528/v3[0:32,0:27] * filter@0:27x64[0:27,0:32] m=32 k=27 n=32 acc=0 fill=1 df=os tag=L0
    VEC map relu ofmap@0:1024x32[0:1024,0:32] <- ofmap@0:1024x32[0:1024,0:32] tag=L0
    VEC dotacc "dot-product" ofmap@63488:1024x1[0:1,0:1] <- ifmap@0:1x25088[0:1,12544:25088], ifmap@49152:1x12544[0:1,0:12544] tag=L21
    STORE t0:12321x64[0:1024,0:32] <- ofmap@0:1024x32 acc=0 tag=L0
    COPY t5 <- v9 words=200704 tag=L3          (COPY t5 axis=1 0:64 <- ... for a part)
    HOST t7 macs=0 reads=4000 reason="..." term="(...)" tag=L4

A slot is `sp@offset:RxC`; an operand adds `[r0:r1,c0:c1]` (and `/view` for a resident
input read through an im2col view); `array` is the stationary operand.
"""
from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import fields

import numpy as np

from apsat.backends.systolic.isa import (ARRAY, Buffer, Copy, Gather, Group, Host, Load, Matmul, Operand,
                                         Preload, Region, Slot, Store, Stream, Vec, View)
from apsat.backends.systolic.views import dims_after, parse_step, step_text
from apsat.lang.program import OpaqueNode
from apsat.errors import ApsatError
from apsat.targets.systolic import Accelerator

HEADER = "; apsat systolic stream v1"


class StreamParseError(ApsatError):
    """Text that is not a stream this module wrote; the message names the line."""


# ---- small codecs ---------------------------------------------------------------------------

def _dims(d) -> str:
    return "x".join(str(v) for v in d) if len(d) else "-"


def _parse_dims(t: str) -> tuple:
    return () if t == "-" else tuple(int(v) for v in t.split("x"))


def _q(s: str) -> str:
    return json.dumps(s)


_SLOT = re.compile(r"^(\w+)@(\d+):(\d+)x(\d+)$")
_OPND = re.compile(r"^(\w+)@(\d+):(\d+)x(\d+)(?:/(\w+))?\[(\d+):(\d+),(\d+):(\d+)\]$")
_REF = re.compile(r"^([\w.]+)(?::(\d+)x(\d+))?\[(\d+):(\d+),(\d+):(\d+)\]$")


def _slot(t: str) -> Slot:
    m = _SLOT.match(t)
    if not m:
        raise ValueError(f"not a slot: {t!r}")
    return Slot(m.group(1), *(int(v) for v in m.group(2, 3, 4)))


def _operand(t: str):
    if t == ARRAY:
        return ARRAY
    m = _OPND.match(t)
    if not m:
        raise ValueError(f"not an operand: {t!r}")
    return Operand(Slot(m.group(1), *(int(v) for v in m.group(2, 3, 4))),
                   Region(*(int(v) for v in m.group(6, 7, 8, 9))), m.group(5))


def _op_text(op) -> str:
    return ARRAY if op == ARRAY else op.text()


def _ref(t: str):
    """`name[r0:r1,c0:c1]` or `name:RxC[r0:r1,c0:c1]` -> (name, shape or None, Region)."""
    m = _REF.match(t)
    if not m:
        raise ValueError(f"not a region reference: {t!r}")
    shape = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
    return m.group(1), shape, Region(*(int(v) for v in m.group(4, 5, 6, 7)))


class _Quoted(str):
    """A token that was a JSON string (never read as key=value)."""


_KEY = re.compile(r'[\w.]+="')


def _tokens(line: str) -> list:
    """Space-separated tokens. A token `"..."` is a JSON string (decoded, a _Quoted); a
    token `key="..."` becomes `key=<decoded string>`, spaces and all."""
    out, i, dec = [], 0, json.JSONDecoder()
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        if line[i] == '"':
            value, i = dec.raw_decode(line, i)
            out.append(_Quoted(value))
            continue
        m = _KEY.match(line, i)
        if m:
            value, i = dec.raw_decode(line, m.end() - 1)
            out.append(line[m.start():m.end() - 1] + value)
            continue
        j = line.find(" ", i)
        j = len(line) if j < 0 else j
        out.append(line[i:j])
        i = j
    return out


def _kv(tokens) -> dict:
    return dict(t.split("=", 1) for t in tokens if not isinstance(t, _Quoted) and "=" in t)


def _npy(arr) -> str:
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def _opaque_json(node: OpaqueNode) -> str:
    return json.dumps({"node": base64.b64encode(node.node).decode(), "arg_inputs": list(node.arg_inputs),
                       "constants": {str(k): _npy(v) for k, v in node.constants.items()},
                       "input_types": list(node.input_types), "output_index": node.output_index,
                       "output_type": node.output_type, "opsets": [list(o) for o in node.opsets]},
                      separators=(",", ":"))


def _opaque_node(text: str) -> OpaqueNode:
    d = json.loads(text)
    consts = {int(k): np.load(io.BytesIO(base64.b64decode(v)), allow_pickle=False)
              for k, v in d["constants"].items()}
    return OpaqueNode(base64.b64decode(d["node"]), tuple(d["arg_inputs"]), consts,
                      tuple(d["input_types"]), d["output_index"], d["output_type"],
                      tuple(tuple(o) for o in d["opsets"]))


# ---- writing --------------------------------------------------------------------------------

def instruction_text(ins) -> str:
    """One instruction as its line."""
    tag = f" tag={ins.tag}"
    if isinstance(ins, Load):
        return f"LOAD {ins.dst.text()} <- {ins.src}{ins.region.text()} words={ins.words}{tag}"
    if isinstance(ins, Store):
        return (f"STORE {ins.dst}:{ins.shape[0]}x{ins.shape[1]}{ins.region.text()} <- "
                f"{ins.src.text()} acc={int(ins.accumulate)}{tag}")
    if isinstance(ins, Copy):
        part = "" if ins.axis is None else f" axis={ins.axis} {ins.lo}:{ins.hi}"
        return f"COPY {ins.dst}{part} <- {ins.src} words={ins.words}{tag}"
    if isinstance(ins, Gather):
        return f"GATHER {ins.dst} <- {ins.src} by {ins.index} axis={ins.axis} words={ins.words}{tag}"
    if isinstance(ins, Preload):
        return f"PRELOAD {ins.src.text()}{tag}"
    if isinstance(ins, Matmul):
        return (f"MATMUL {ins.dst.text()} <- {_op_text(ins.a)} * {_op_text(ins.b)} m={ins.m} "
                f"k={ins.k} n={ins.n} acc={int(ins.accumulate)} fill={int(ins.fill)}"
                f"{f' df={ins.dataflow}' if ins.dataflow else ''}"
                f"{f' init={ins.init.text()}' if ins.init is not None else ''}"
                f"{f' blocks={ins.blocks}' if ins.blocks != 1 else ''}{tag}")
    if isinstance(ins, Vec):
        srcs = ", ".join(s.text() for s in ins.srcs)
        item = f" item={_dims(ins.item)}" if ins.mode == "row" else ""
        return f"VEC {ins.mode} {_q(ins.op)} {ins.dst.text()} <- {srcs}{item}{tag}"
    if isinstance(ins, Host):
        return (f"HOST {ins.dst} macs={ins.macs} reads={ins.reads} reason={_q(ins.reason)} "
                f"term={_q(ins.term)}{tag}")
    raise TypeError(f"unknown instruction {ins!r}")


def to_text(stream: Stream) -> str:
    """The whole stream as text (see the module docstring)."""
    a = stream.accel
    lines = [HEADER,
             " ".join([".accel"] + [f"{f.name}={_q(getattr(a, f.name)) if f.name in ('dataflow', 'name') else getattr(a, f.name)}"
                                    for f in fields(Accelerator) if getattr(a, f.name) is not None])]
    for b in stream.buffers.values():
        extra = f" {_q(b.tensor)}" if b.tensor is not None else (f" {b.value!r}" if b.kind == "const" else "")
        lines.append(f".buffer {b.name} {b.kind} {_dims(b.dims)}{extra}")
    for v in stream.views.values():
        lines.append(f".view {v.name} {v.base}" + "".join(f" |{step_text(s)}" for s in v.steps))
    for g in stream.groups.values():
        gemm = f" m={g.m} k={g.k} n={g.n} a_mode={g.a_mode}" if g.m else ""
        gemm += f" df={g.dataflow}" if g.dataflow else ""
        gemm += f" vcols={g.vector_cols}" if g.vector_cols else ""
        lines.append(f".group {g.tag} {g.kind} {_q(g.label)}{gemm}")
    for name, v in stream.outputs.items():
        lines.append(f".output {_q(name)} {v}")
    for key, node in stream.opaque.items():
        lines.append(f".opaque {_q(key)} {_opaque_json(node)}")
    lines.append(f".options im2col={stream.options['im2col']} fold_copies={int(stream.options['fold_copies'])}"
                 f" fuse_zips={int(stream.options.get('fuse_zips', False))}")
    lines.append(".init")
    lines += [instruction_text(i) for i in stream.init]
    lines.append(".main")
    lines += [instruction_text(i) for i in stream.main]
    return "\n".join(lines) + "\n"


# ---- parsing --------------------------------------------------------------------------------

FLOAT_FIELDS = ("dram_bandwidth", "flex_slack")


def _parse_accel(kv: dict) -> Accelerator:
    typed = {}
    for f in fields(Accelerator):
        if f.name not in kv and f.name in ("flex_slack", "operand_bytes", "accumulator_bytes"):
            continue                                        # streams written before they existed
        v = kv[f.name]
        typed[f.name] = v if f.name in ("dataflow", "name") else (float(v) if f.name in FLOAT_FIELDS else int(v))
    return Accelerator(**typed)


def parse_instruction(line: str):
    """Inverse of instruction_text."""
    tok = _tokens(line)
    op, kv = tok[0], _kv(tok)
    tag = kv.get("tag", "")
    if op == "LOAD":
        src, _, region = _ref(tok[3])
        return Load(_slot(tok[1]), src, region, int(kv["words"]), tag)
    if op == "STORE":
        dst, shape, region = _ref(tok[1])
        return Store(dst, shape, region, _slot(tok[3]), kv["acc"] == "1", tag)
    if op == "COPY":
        if "axis" in kv:
            lo, hi = tok[3].split(":")
            return Copy(tok[1], tok[5], int(kv["words"]), int(kv["axis"]), int(lo), int(hi), tag)
        return Copy(tok[1], tok[3], int(kv["words"]), tag=tag)
    if op == "GATHER":
        return Gather(tok[1], tok[3], tok[5], int(kv["axis"]), int(kv["words"]), tag)
    if op == "PRELOAD":
        return Preload(_operand(tok[1]), tag)
    if op == "MATMUL":
        return Matmul(_operand(tok[1]), _operand(tok[3]), _operand(tok[5]), int(kv["m"]), int(kv["k"]),
                      int(kv["n"]), kv["acc"] == "1", kv["fill"] == "1", tag, kv.get("df", ""),
                      _operand(kv["init"]) if "init" in kv else None, int(kv.get("blocks", 1)))
    if op == "VEC":
        arrow = tok.index("<-")
        srcs = [t.rstrip(",") for t in tok[arrow + 1:] if "=" not in t]
        item = _parse_dims(kv["item"]) if "item" in kv else ()
        return Vec(tok[1], tok[2], _operand(tok[3]), tuple(_operand(s) for s in srcs), item, tag)
    if op == "HOST":
        return Host(tok[1], kv["term"], int(kv["reads"]), int(kv["macs"]), kv["reason"], tag)
    raise ValueError(f"unknown opcode {op!r}")


def parse(text: str) -> Stream:
    """A Stream from its text form; StreamParseError naming the line for anything else."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise StreamParseError(f"line 1: not an apsat systolic stream (expected {HEADER!r})")
    stream = None
    section = None
    for no, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        try:
            if line.startswith(".accel "):
                stream = Stream(_parse_accel(_kv(_tokens(line)[1:])))
            elif stream is None:
                raise ValueError("the .accel line must come first")
            elif line.startswith(".buffer "):
                tok = _tokens(line)
                name, kind, dims = tok[1], tok[2], _parse_dims(tok[3])
                tensor = tok[4] if kind in ("input", "weight") else None
                value = float(tok[4]) if kind == "const" else None
                stream.buffers[name] = Buffer(name, dims, kind, tensor, value)
            elif line.startswith(".view "):
                head, *steps = line.split(" |")
                _, name, base = head.split()
                steps = tuple(parse_step(s) for s in steps)
                stream.views[name] = View(name, base, steps, dims_after(stream.buffers[base].dims, steps))
            elif line.startswith(".group "):
                tok = _tokens(line)
                kv = _kv(tok[4:])
                stream.groups[tok[1]] = Group(tok[1], tok[2], tok[3], int(kv.get("m", 0)), int(kv.get("k", 0)),
                                              int(kv.get("n", 0)), kv.get("a_mode", ""), kv.get("df", ""),
                                              int(kv.get("vcols", 0)))
            elif line.startswith(".output "):
                tok = _tokens(line)
                stream.outputs[tok[1]] = tok[2]
            elif line.startswith(".opaque "):
                key, end = json.JSONDecoder().raw_decode(line, len(".opaque "))
                stream.opaque[key] = _opaque_node(line[end:].strip())
            elif line.startswith(".options "):
                kv = _kv(_tokens(line)[1:])
                stream.options = {"im2col": kv["im2col"], "fold_copies": kv["fold_copies"] == "1",
                                  "fuse_zips": kv.get("fuse_zips", "0") == "1"}
            elif line in (".init", ".main"):
                section = stream.init if line == ".init" else stream.main
            elif section is None:
                raise ValueError("an instruction before .init or .main")
            else:
                section.append(parse_instruction(line))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise StreamParseError(f"line {no}: {e}: {line[:80]}") from None
    if stream is None:
        raise StreamParseError("no .accel line")
    return stream
