"""More line templates of the program generator (fuzz_programs.py), registered in
fuzz_templates.TEMPLATES: ``.data`` assignments (between program tensors of the same or
another shape and dtype, on the first leaves, and of a plain tensor to a tensor the body made,
which the runtime refuses: fuzz_limits.expected_refusal), torch.func and vmap (``vmap``,
nested and with ``in_dims``, ``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``,
``autograd.functional``'s ``jacobian``, ``hessian`` and ``hvp``), linalg on square matrices
made from the data (solve, Cholesky of an SPD matrix, QR, SVD and pinv compared only through
sign-free quantities, inv, det, slogdet, matrix_exp), and convolutions and pooling (1d and 2d,
transposed, groups / stride / dilation / padding modes, average, adaptive and max pooling
with indices, interpolate, pixel_shuffle, unfold / fold)."""

from __future__ import annotations

import math

from fuzz_limits import may_reshape_data, may_swap_data, may_values_only_linalg
from fuzz_templates import fl, is_t, template


@template("data", 3)
def t_data(g):
    """``c.data = t``: ``c`` and ``t`` program tensors (same shape and dtype, or not), a first
    leaf ``p`` given a new value (manual SGD), or ``c`` given a plain leaf made before the
    session (refused for a ``c`` the body made: docs/runtime.md, Limitations)."""
    r = g.r
    c = g.pick(lambda v: is_t(v) and not v.dtype.is_complex and may_swap_data(v, g.ns))
    if c is None:
        return None
    cv = g.ns[c]
    same = g.names(lambda v: is_t(v) and v.shape == cv.shape and v.dtype == cv.dtype)
    other = g.names(lambda v: is_t(v) and not v.dtype.is_complex and v.shape != cv.shape)
    leaves = g.names(lambda v: fl(v) and v.is_leaf and v.requires_grad and v.numel() > 0)
    leaves = [n for n in leaves if n.startswith("a") and may_swap_data(g.ns[n], g.ns)]
    forms = []
    if same:
        t = r.choice(same)
        scaled = f"{t}.detach() * 2 if {t}.is_floating_point() else {t}.detach() + 1"
        forms += [f"{c}.data = {t}", f"{c}.data = {scaled}"]
    reshape = may_reshape_data(cv, g.ns)  # leaf-data-reshaped-..., view-replay-after-...
    if other and reshape:
        forms += [f"{c}.data = {r.choice(other)}"]
    if cv.dim() >= 1 and cv.shape[0] >= 2:
        forms += [f"{c}.data = {c}.detach().flip(0)"]
        forms += [f"{c}.data = {c}.detach()[1:]"] if reshape else []
    if leaves:
        p = r.choice(leaves)
        pv = g.ns[p]
        forms += [f"{p}.data = {p}.data * 0.5 + 0.25", f"{p}.data = {p}.detach().tanh()"]
        if pv.grad is not None:
            forms += [f"{p}.data = {p}.data - 0.1 * {p}.grad"] * 2
        fit = g.names(lambda v: fl(v) and v.shape == pv.shape and v.dtype == pv.dtype)
        if fit:
            forms += [f"{p}.data = {r.choice(fit)}"]
    plain = [n for n in g.names(lambda v: is_t(v) and not v.dtype.is_complex)]
    plain = [n for n in plain if n.startswith("a") and n != c]
    if not reshape:
        plain = [n for n in plain if g.ns[n].shape == cv.shape]
    if plain and g.section == "body" and r.random() < 0.15:  # fuzz_limits.expected_refusal
        return f"{c}.data = {r.choice(plain)}"
    return r.choice(forms) if forms else None


FUNC_ANY = (
    "torch.vmap(lambda r: (r.sin() * r).sum())({x})",
    "torch.vmap(lambda r: r.cumsum(0) / (r.norm() + 1))({x})",
    "torch.vmap(lambda r, s: r * s + s.mean(), in_dims=(0, None))({x}, {x}[0])",
    "torch.vmap(lambda r: torch.where(r > 0, r.exp(), r * 2), out_dims=-1)({x})",
    "torch.func.grad(lambda r: (r.tanh() * r).sum())({x})",
    "torch.func.grad(lambda r: r.logsumexp(0).sum() if r.dim() else r.sigmoid())({x})",
    "torch.func.grad_and_value(lambda r: (r.sin() ** 2).sum())({x})",
    "torch.func.jvp(lambda r: r.sin() * r, ({x},), (torch.ones_like({x}),))",
    "torch.func.jacrev(lambda r: r.sin() * r.sum())({x}.flatten()[:4])",
    "torch.func.jacfwd(lambda r: r.exp() * r[0])({x}.flatten()[:3])",
    "torch.autograd.functional.jacobian(lambda r: r.tanh() * r, {x}.flatten()[:4])",
    "torch.autograd.functional.hessian(lambda r: (r.tanh() * r).sum(), {x}.flatten()[:3])",
    "torch.autograd.functional.hvp(lambda r: (r.sin() * r).sum(), {x}.flatten()[:4], "
    "torch.ones_like({x}.flatten()[:4]))",
    "torch.autograd.functional.vjp(lambda r: r.exp().sum(0), {x}, torch.ones_like({x}.sum(0)))",
)
FUNC_2D = (
    "torch.vmap(lambda r: r.softmax(-1) * r.amax())({x})",
    "torch.vmap(torch.outer)({x}, {x})",
    "torch.vmap(torch.vmap(lambda v: v.exp() - v))({x})",
    "torch.vmap(lambda r: r @ r.t() if r.dim() == 2 else r.outer(r))({x})",
    "torch.func.vmap(torch.func.grad(lambda r: (r.tanh() ** 2).sum()))({x})",
)
VJP = "{o}, _fn = torch.func.vjp(lambda r: r.tanh() * 2, {x}); {p} = _fn(torch.ones_like({o}))[0]"


@template("func", 3)
def t_func(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and v.shape[0] >= 1 and v.numel() >= 4)
    if x is None:
        return None
    forms = list(FUNC_ANY) + (list(FUNC_2D) if g.ns[x].dim() >= 2 else [])
    if g.r.random() < 0.1:
        return VJP.format(o=g.new(), p=g.new(), x=x) + "; del _fn"
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)


LINALG = (
    "torch.linalg.solve({s}, {m})",
    "torch.linalg.cholesky({s})",
    "torch.cholesky_solve({m}, torch.linalg.cholesky({s}))",
    "torch.linalg.solve_triangular(torch.linalg.cholesky({s}), {m}, upper=False)",
    "torch.linalg.inv({s})",
    "torch.linalg.slogdet({s})",
    "torch.linalg.matrix_exp({m} * 0.25)",
    "torch.linalg.pinv({m}) @ {m}",
    "torch.linalg.lu_solve(*torch.linalg.lu_factor({s}), {m})",
    "torch.linalg.matrix_power({m}, 3)",
    "torch.linalg.multi_dot([{m}, {m}.mT, {m}])",
)
# Known limit values-only-linalg-under-a-mode: only on inputs that require grad.
VALUES_ONLY = (
    "torch.linalg.svdvals({m})",
    "torch.linalg.eigvalsh({s})",
    "torch.linalg.matrix_norm({m}, 'nuc')",
    "torch.linalg.matrix_norm({m}, 2)",
    "torch.linalg.cond({s})",
)
# Sign-free quantities only: Q R and U S Vh are unique up to signs that another LAPACK path
# could flip, their products are not.
LINALG_PAIRS = (
    "_q, _r = torch.linalg.qr({m}); {o} = _q @ _r; {p} = _r.diagonal().abs(); del _q, _r",
    "_u, {o}, _vh = torch.linalg.svd({m}); {p} = (_u * {o}) @ _vh; del _u, _vh",
    "_l, {o} = torch.linalg.eigh({s}); {p} = _l.sum() + ({o} * {o}).sum(); del _l",
)


@template("linalg", 3)
def t_linalg(g):
    x = g.pick(lambda v: fl(v) and v.numel() >= 4)
    if x is None:
        return None
    n = min(math.isqrt(min(g.ns[x].numel(), 16)), 4)
    m, s = g.new(), g.new()
    base = (
        f"{m} = {x}.flatten()[:{n * n}].reshape({n}, {n}); "
        f"{s} = {m} @ {m}.mT + {n} * torch.eye({n}, dtype={x}.dtype)\n"
    )
    if g.r.random() < 0.3:
        return base + g.r.choice(LINALG_PAIRS).format(m=m, s=s, o=g.new(), p=g.new())
    forms = LINALG + (VALUES_ONLY if may_values_only_linalg(g.ns[x]) else ())
    if not g.ns[x].requires_grad:  # known limit det-double-backward-under-a-mode
        forms += ("torch.linalg.det({m})",)
    return base + f"{g.new()} = " + g.r.choice(forms).format(m=m, s=s)


CONV1D = (
    "F.conv1d({i}, {w}(4, 2, 3), stride={st}, padding={pd}, dilation={dl})",
    "F.conv1d({i}, {w}(4, 1, 2), groups=2, padding='same')",
    "F.conv1d(F.pad({i}, (2, 1), mode='{mode}'), {w}(3, 2, 2))",
    "F.conv_transpose1d({i}, {w}(2, 3, 3), stride={st}, padding=1, output_padding={st} - 1)",
    "F.conv_transpose1d({i}, {w}(2, 2, 2), groups=2, dilation=2)",
    "F.avg_pool1d({i}, 2, ceil_mode=True, count_include_pad=False, padding=1)",
    "F.adaptive_avg_pool1d({i}, 3)",
    "F.adaptive_max_pool1d({i}, 2)",
    "F.max_pool1d({i}, 2, stride=1, dilation=2)",
    "F.interpolate({i}, scale_factor=2, mode='{interp1}')",
    "F.lp_pool1d({i}.abs() + 0.1, 2, 2)",
)
CONV2D = (
    "F.conv2d({i}, {w}(4, 2, 2, 2), stride={st}, padding={pd}, dilation={dl})",
    "F.conv2d({i}, {w}(2, 1, 3, 1), groups=2, padding='same')",
    "F.conv2d(F.pad({i}, (1, 1, 1, 0), mode='{mode}'), {w}(3, 2, 2, 2), bias={w}(3))",
    "F.conv_transpose2d({i}, {w}(2, 3, 2, 2), stride={st}, output_padding={st} - 1)",
    "F.conv_transpose2d({i}, {w}(2, 1, 3, 3), groups=2, padding=1)",
    "F.avg_pool2d({i}, 2, ceil_mode=True)",
    "F.adaptive_avg_pool2d({i}, (2, 1))",
    "F.adaptive_max_pool2d({i}, 2)",
    "F.interpolate({i}, scale_factor=2, mode='{interp2}')",
    "F.interpolate({i}, size=(3, 5), mode='bilinear', align_corners=True)",
    "F.pixel_shuffle({i}.repeat(1, 2, 1, 1), 2)",
    "F.pixel_unshuffle({i}[..., :2, :2], 2)",
    "F.unfold({i}, 2)",
    "F.fold(F.unfold({i}, 2, padding=1), ({h}, {wd}), 2, padding=1)",
    "F.instance_norm({i})",
)
MAXPOOL = "{o}, {p} = F.max_pool2d({i}, 2, stride=1, return_indices=True); {q} = F.max_unpool2d({o}, {p}, 2, stride=1)"  # noqa: E501
WEIGHT = (
    "_w{k} = lambda *s: torch.linspace(-1, 1, torch.Size(s).numel(), dtype={x}.dtype)"
    ".reshape(s){rg}"
)


@template("conv", 3)
def t_conv(g):
    """A convolution or pooling of a [1, 2, L] or [1, 2, H, W] view of the data; weights are
    made from ``linspace`` (requiring grad half the time)."""
    x = g.pick(lambda v: fl(v) and v.numel() >= 8)
    if x is None:
        return None
    r, k, numel = g.r, g.k, g.ns[x].numel()
    i = g.new()
    w = f"_w{k}"
    weight = WEIGHT.format(k=k, x=x, rg=".requires_grad_()" if r.random() < 0.5 else "")
    h = wd = 0
    if r.random() < 0.5 or numel < 16:
        L = min(numel // 2, 12)
        base = f"{i} = {x}.flatten()[:{2 * L}].reshape(1, 2, {L})"
        forms = CONV1D
    else:
        h = 2 if numel < 24 else 3
        wd = min(numel // (2 * h), 5)
        base = f"{i} = {x}.flatten()[:{2 * h * wd}].reshape(1, 2, {h}, {wd})"
        forms = CONV2D
    if forms is CONV2D and r.random() < 0.15:
        line = MAXPOOL.format(i=i, o=g.new(), p=g.new(), q=g.new())
    else:
        line = f"{g.new()} = " + r.choice(forms).format(
            i=i,
            w=w,
            st=r.choice([1, 2]),
            pd=r.choice([0, 1, "'same'", "'valid'"]),
            dl=r.choice([1, 2]),
            mode=r.choice(["reflect", "replicate", "circular", "constant"]),
            interp1=r.choice(["nearest", "linear", "nearest-exact"]),
            interp2=r.choice(["nearest", "bilinear", "bicubic", "nearest-exact"]),
            h=h,
            wd=wd,
        )
    return f"{weight}\n{base}\n{line}; del {w}"
