"""Lowerings of InstanceNormalization and GroupNormalization through the language's
`layer-norm eps` (which normalises over all item dims), then scale and bias. Conventions
(ctx, returned terms, Unlowerable): lowering_tensor.py.
"""
from __future__ import annotations

import math


def _check_vector(ctx, i: int, size: int, what: str):
    if ctx.dims(i) != (size,):
        ctx.fail(f"input {i} ({ctx.node.input[i]!r}) has dims {ctx.dims(i)}, expected "
                 f"({size},): one per {what}")


def lower_instancenorm(ctx):
    """`(access x 2)`: each (n, c)'s spatial dims are the item, `compute layer-norm eps`
    over them, then the per-channel scale and bias broadcast as (1, C, 1, ..)."""
    b, dims = ctx.b, ctx.dims(0)
    if len(dims) < 3:
        ctx.fail(f"input dims {dims} have no spatial axes")
    for i in (1, 2):
        _check_vector(ctx, i, dims[1], "channel")
    y = b.compute("layer-norm", b.at(ctx.term(0), 2), float(ctx.attr("epsilon", 1e-5)))
    y = b.elementwise("elementwise-mul", [y, b.channel(ctx.term(1), len(dims))])
    return [b.elementwise("elementwise-add", [y, b.channel(ctx.term(2), len(dims))])]


def lower_groupnorm(ctx):
    """x reshaped to ((N, G), (C/G * spatial)), `compute layer-norm eps` over each group's
    item. Opset 21: scale and bias are per channel, applied after reshaping back to x's
    dims; opset 18: per group, applied as (1, G, 1) in the grouped layout before it.
    stash_type (the precision of the statistics) is float32 here whatever it says."""
    b, dims = ctx.b, ctx.dims(0)
    g = ctx.attr("num_groups", None)
    if not isinstance(g, int) or g < 1:
        ctx.bad_attr("num_groups", f"needs a positive int, got {g}")
    if len(dims) < 2 or dims[1] % g:
        ctx.fail(f"input dims {dims}: channels not divisible into {g} groups")
    per_channel = ctx.opset >= 21
    for i in (1, 2):
        _check_vector(ctx, i, dims[1] if per_channel else g, "channel" if per_channel else "group")
    y = b.compute("layer-norm", b.reshape(ctx.term(0), (dims[0], g, math.prod(dims[1:]) // g), 2),
                  float(ctx.attr("epsilon", 1e-5)))
    if per_channel:
        y = b.elementwise("elementwise-mul", [b.reshape(y, dims), b.channel(ctx.term(1), len(dims))])
        return [b.elementwise("elementwise-add", [y, b.channel(ctx.term(2), len(dims))])]
    y = b.elementwise("elementwise-mul", [y, b.reshape(ctx.term(1), (1, g, 1))])
    y = b.elementwise("elementwise-add", [y, b.reshape(ctx.term(2), (1, g, 1))])
    return [b.reshape(y, dims)]
