"""Templates of torch.nn.functional: modules (conv1d, attention, cross entropy, pooling,
group and batch norm), losses with their reductions, and convolutions and pooling (1d and 2d,
transposed, groups / stride / dilation / padding modes, average, adaptive and max pooling
with indices, interpolate, pixel_shuffle, unfold / fold)."""

from __future__ import annotations

from .registry import fl, template

MODULE = (
    "F.conv1d({x}.reshape(-1, 1, 6), torch.ones(2, 1, 3, dtype={x}.dtype, requires_grad=True))",
    "F.softplus({x}) @ torch.ones(6, 3, dtype={x}.dtype)",
    "F.scaled_dot_product_attention({x}[None], {x}[None], {x}[None])",
    "F.cross_entropy({x}.reshape(-1, 6), torch.zeros({x}.numel() // 6, dtype=torch.long))",
    "F.mse_loss({x}, torch.zeros_like({x}))",
    "F.max_pool1d({x}.reshape(-1, 1, 6), 2)",
    "F.group_norm({x}.reshape(-1, 2, 3), 1)",
)


BATCH_NORM = (
    "_bn_m = torch.zeros(6, dtype={x}.dtype); _bn_v = torch.ones(6, dtype={x}.dtype)\n"
    "{o} = F.batch_norm({x}.reshape(-1, 6), _bn_m, _bn_v, training=True)"
)


@template("module", 2)
def t_module(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 2 and v.shape[-1] == 6 and v.numel() > 0)
    if x is None:
        return None
    o = g.new()
    if g.r.random() < 1 / 8:
        return BATCH_NORM.format(o=o, x=x)
    return f"{o} = " + g.r.choice(MODULE).format(x=x)


LOSS = (
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, reduction='{red}')",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, reduction='{red}', label_smoothing=0.1)",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, ignore_index=1, reduction='{red}')",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, weight=torch.arange(1.0, {c} + 1, "
    "dtype={x}.dtype), reduction='{red}')",
    "F.nll_loss({x}.reshape(-1, {c}).log_softmax(-1), {lab}, reduction='{red}')",
    "F.binary_cross_entropy_with_logits({x}, ({x} > 0).to({x}.dtype), reduction='{red}')",
    "F.smooth_l1_loss({x}, {x}.detach() * 0.5, reduction='{red}')",
    "F.huber_loss({x}, torch.zeros_like({x}), reduction='{red}', delta=0.5)",
    "F.kl_div({x}.log_softmax(-1), {x}.detach().softmax(-1), reduction='{red}')",
    "F.layer_norm({x}, {x}.shape[-1:], torch.linspace(0.5, 1.5, {c}, dtype={x}.dtype), "
    "torch.ones({c}, dtype={x}.dtype))",
    "F.rms_norm({x}, {x}.shape[-1:], eps=1e-5)",
    "F.group_norm({x}.reshape(-1, {c}, 1), 1 if {c} % 2 else 2, "
    "torch.full(({c},), 2.0, dtype={x}.dtype))",
    "F.embedding(torch.tensor([[0, 1], [1, 0]]), {x}.reshape(-1, {c}), padding_idx=0)",
    "F.embedding_bag(torch.tensor([0, 1, 1]), {x}.reshape(-1, {c}), torch.tensor([0, 1]), "
    "mode='{bag}')",
)


@template("loss", 3)
def t_loss(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and v.numel() >= 2 * max(v.shape[-1], 1))
    if x is None:
        return None
    v = g.ns[x]
    c = v.shape[-1]
    n = v.numel() // c
    lab = f"torch.arange({n}) % {c}"
    red = g.r.choice(["none", "sum", "mean"])
    bag = g.r.choice(["sum", "mean", "max"])
    form = g.r.choice(LOSS)
    return f"{g.new()} = " + form.format(x=x, c=c, lab=lab, red=red, bag=bag)


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
