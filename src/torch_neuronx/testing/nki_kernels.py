"""NKI kernels in the style of AWS's tutorials, written for this project, for tests/nki and benchmarks/bench_nki.py.

Each kernel is plain NKI 0.6 (``@nki.jit``, ``nl.ndarray``, ``nisa.*`` with
``dst=``) and would run unchanged under AWS's ``nki``; here they run on
:mod:`torch_neuronx.nki`, imported by its full name so that the tests always
exercise this interpreter even where AWS's package is installed. Shapes follow
the hardware's tiles: 128 partitions, 128-wide stationary and 512-wide moving
matmul operands, one 2 KiB PSUM bank per accumulation tile.
"""

from __future__ import annotations

from typing import Any

import torch_neuronx.nki as nki

nl = nki.language
nisa = nki.isa

P = 128  # partitions (nl.tile_size.pmax)
FREE = 512  # moving free size / float32 per PSUM bank


@nki.jit
def tiled_add(a: Any, b: Any) -> Any:
    """``a + b`` for (rows, cols) with rows % 128 == 0, cols % 512 == 0; one program per 128-row band."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    band = nl.program_id(0)
    bands = nl.num_programs(0)
    for r in nl.affine_range(rows // P // bands):
        row = (band * (rows // P // bands) + r) * P
        for c in nl.affine_range(cols // FREE):
            ta = nl.ndarray((P, FREE), dtype=a.dtype, buffer=nl.sbuf)
            tb = nl.ndarray((P, FREE), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=ta, src=a[row:row + P, c * FREE:(c + 1) * FREE])
            nisa.dma_copy(dst=tb, src=b[row:row + P, c * FREE:(c + 1) * FREE])
            tc = nl.ndarray((P, FREE), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
            nisa.dma_copy(dst=out[row:row + P, c * FREE:(c + 1) * FREE], src=tc)
    return out


@nki.jit
def transpose_2d(x: Any) -> Any:
    """``x.T`` for (m, n), both multiples of 128, in 128 x 128 blocks on the Tensor Engine."""
    m, n = x.shape
    out = nl.ndarray((n, m), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(m // P):
        for j in nl.affine_range(n // P):
            block = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=block, src=x[i * P:(i + 1) * P, j * P:(j + 1) * P])
            flipped = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=flipped, data=block)
            back = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=back, src=flipped)
            nisa.dma_copy(dst=out[j * P:(j + 1) * P, i * P:(i + 1) * P], src=back)
    return out


@nki.jit
def avg_pool(x: Any, k: int) -> Any:
    """k x k average pooling of (channels <= 128, h, w) with an access pattern over the SBUF tile."""
    c, h, w = x.shape
    out = nl.ndarray((c, h // k, w // k), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray((c, h, w), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    # (channel, out row, out col, window row, window col) over the channel's h*w elements
    windows = tile.ap([[h * w, c], [k * w, h // k], [k, w // k], [w, k], [1, k]])
    sums = nl.ndarray((c, h // k, w // k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=sums, op=nl.add, data=windows, axis=(3, 4))
    mean = nl.ndarray((c, h // k, w // k), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=mean, data=sums, op0=nl.multiply, operand0=1.0 / (k * k))
    nisa.dma_copy(dst=out, src=mean)
    return out


@nki.jit
def matmul_basic(lhs_t: Any, rhs: Any) -> Any:
    """``lhs_t.T @ rhs`` for lhs_t (k <= 128, m <= 128) and rhs (k, n <= 512): one Tensor Engine instruction."""
    k, m = lhs_t.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((k, m), dtype=lhs_t.dtype, buffer=nl.sbuf)
    b = nl.ndarray((k, n), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhs_t)
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def matmul_tiled(lhs_t: Any, rhs: Any) -> Any:
    """``lhs_t.T @ rhs``, every dimension tiled; partial products over k accumulate in one PSUM tile."""
    k, m = lhs_t.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(m // P):
        for j in nl.affine_range(n // FREE):
            acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
            for kk in nl.affine_range(k // P):
                a = nl.ndarray((P, P), dtype=lhs_t.dtype, buffer=nl.sbuf)
                b = nl.ndarray((P, FREE), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[kk * P:(kk + 1) * P, i * P:(i + 1) * P])
                nisa.dma_copy(dst=b, src=rhs[kk * P:(kk + 1) * P, j * FREE:(j + 1) * FREE])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=kk > 0)
            res = nl.ndarray((P, FREE), dtype=lhs_t.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[i * P:(i + 1) * P, j * FREE:(j + 1) * FREE], src=res)
    return out


@nki.jit
def matmul_hoisted(lhs_t: Any, rhs: Any) -> Any:
    """Tiled matmul that loads each stationary column block once per m tile and each moving block once per n."""
    k, m = lhs_t.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(m // P):
        lhs_tiles = []
        for kk in nl.static_range(k // P):
            a = nl.ndarray((P, P), dtype=lhs_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhs_t[kk * P:(kk + 1) * P, i * P:(i + 1) * P])
            lhs_tiles.append(a)
        for j in nl.affine_range(n // FREE):
            rhs_tiles = []
            for kk in nl.static_range(k // P):
                b = nl.ndarray((P, FREE), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[kk * P:(kk + 1) * P, j * FREE:(j + 1) * FREE])
                rhs_tiles.append(b)
            acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
            for kk in nl.affine_range(k // P):
                nisa.nc_matmul(dst=acc, stationary=lhs_tiles[kk], moving=rhs_tiles[kk])
            res = nl.ndarray((P, FREE), dtype=lhs_t.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[i * P:(i + 1) * P, j * FREE:(j + 1) * FREE], src=res)
    return out


@nki.jit
def matmul_blocked(lhs_t: Any, rhs: Any, block_m: int = 2, block_n: int = 2) -> Any:
    """Tiled matmul over blocks of block_m x block_n output tiles, each operand tile loaded once per block."""
    k, m = lhs_t.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    # loops that build Python lists of tiles are static_range (unrolled, each tile its own allocation, live while
    # the list holds it); the others are compiler loops, whose body tiles live for one iteration
    for bm in nl.affine_range(m // (P * block_m)):
        lhs_blocks = []
        for t in nl.static_range(block_m):
            col = (bm * block_m + t) * P
            row_tiles = []
            for kk in nl.static_range(k // P):
                a = nl.ndarray((P, P), dtype=lhs_t.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[kk * P:(kk + 1) * P, col:col + P])
                row_tiles.append(a)
            lhs_blocks.append(row_tiles)
        for bn in nl.affine_range(n // (FREE * block_n)):
            rhs_blocks = []
            for t in nl.static_range(block_n):
                col = (bn * block_n + t) * FREE
                col_tiles = []
                for kk in nl.static_range(k // P):
                    b = nl.ndarray((P, FREE), dtype=rhs.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=b, src=rhs[kk * P:(kk + 1) * P, col:col + FREE])
                    col_tiles.append(b)
                rhs_blocks.append(col_tiles)
            for ti in nl.affine_range(block_m):
                for tj in nl.affine_range(block_n):
                    acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                    for kk in nl.affine_range(k // P):
                        nisa.nc_matmul(dst=acc, stationary=lhs_blocks[ti][kk], moving=rhs_blocks[tj][kk])
                    res = nl.ndarray((P, FREE), dtype=lhs_t.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res, src=acc)
                    row = (bm * block_m + ti) * P
                    col = (bn * block_n + tj) * FREE
                    nisa.dma_copy(dst=out[row:row + P, col:col + FREE], src=res)
    return out


@nki.jit
def softmax_rows(x: Any) -> Any:
    """Softmax over the last dimension of (rows % 128 == 0, cols), in float32 on chip."""
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    for r in nl.affine_range(rows // P):
        t = nl.ndarray((P, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r * P:(r + 1) * P, :])
        row_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=row_max, op=nl.maximum, data=t, axis=1, negate=True)
        e = nl.ndarray((P, cols), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=row_max, reduce_op=nl.add, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        y = nl.ndarray((P, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r * P:(r + 1) * P, :], src=y)
    return out


@nki.jit
def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension of (rows % 128 == 0, d)."""
    rows, d = x.shape
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w_row = nl.ndarray((1, d), dtype=weight.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_row, src=weight.reshape((1, d)))
    w = nl.broadcast_to(w_row, (P, d))  # every partition gets the weights
    for r in nl.affine_range(rows // P):
        t = nl.ndarray((P, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r * P:(r + 1) * P, :])
        sq = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        ssq = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ssq,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=ssq, op0=nl.multiply, operand0=1.0 / d, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        normed = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed, data=t, op0=nl.multiply, operand0=rstd)
        y = nl.ndarray((P, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=normed, data2=w, op=nl.multiply)
        nisa.dma_copy(dst=out[r * P:(r + 1) * P, :], src=y)
    return out


@nki.jit
def attention_fwd(q: Any, k: Any, v: Any, causal: bool = False) -> Any:
    """softmax(q k^T / sqrt(d)) v for one head, q/k/v (seq % 512 == 0, d <= 128), flash-style (online softmax).

    Per 128-query tile: scores against 512-key tiles on the Tensor Engine, running max and sum on the Vector
    and Scalar Engines, probabilities transposed in 128 x 128 blocks and multiplied into a PSUM accumulator.
    """
    seq, d = q.shape
    kv_tile = FREE
    scale = 1.0 / float(d) ** 0.5
    out = nl.ndarray((seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    # K^T resident in SBUF: (d, seq), built from 128-row blocks transposed on the Tensor Engine
    k_t = nl.ndarray((d, seq), dtype=k.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(seq // P):
        kb = nl.ndarray((P, d), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kb, src=k[j * P:(j + 1) * P, :])
        kb_t = nl.ndarray((d, P), dtype=k.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=kb_t, data=kb)
        nisa.tensor_copy(dst=k_t[:, j * P:(j + 1) * P], src=kb_t)
    for i in nl.affine_range(seq // P):
        qb = nl.ndarray((P, d), dtype=q.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=qb, src=q[i * P:(i + 1) * P, :])
        qb_t_psum = nl.ndarray((d, P), dtype=q.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=qb_t_psum, data=qb)
        qb_t = nl.ndarray((d, P), dtype=q.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=qb_t, src=qb_t_psum)
        run_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=run_max, value=-3.0e38)
        run_sum = nl.zeros((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        acc = nl.zeros((P, d), dtype=nl.float32, buffer=nl.sbuf)
        last = ((i + 1) * P + kv_tile - 1) // kv_tile if causal else seq // kv_tile
        for j in nl.sequential_range(last):
            s_psum = nl.ndarray((P, kv_tile), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_psum, stationary=qb_t, moving=k_t[:, j * kv_tile:(j + 1) * kv_tile])
            s = nl.ndarray((P, kv_tile), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=s, data=s_psum, op0=nl.multiply, operand0=scale)
            if causal:  # keep key <= query: (i*P + p) - (j*kv_tile + f) >= 0
                nisa.affine_select(dst=s, pattern=[[-1, kv_tile]], channel_multiplier=1, on_true_tile=s,
                                   on_false_value=-3.0e38, cmp_op=nl.greater_equal, offset=i * P - j * kv_tile)
            tile_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=tile_max, op=nl.maximum, data=s, axis=1)
            new_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=new_max, data1=run_max, data2=tile_max, op=nl.maximum)
            neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_max, data=new_max, op0=nl.multiply, operand0=-1.0)
            probs = nl.ndarray((P, kv_tile), dtype=q.dtype, buffer=nl.sbuf)
            tile_sum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=probs, op=nl.exp, data=s, bias=neg_max, reduce_op=nl.add, reduce_res=tile_sum,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
            corr = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=corr, op=nl.exp, data=run_max, bias=neg_max)
            nisa.tensor_scalar(dst=run_sum, data=run_sum, op0=nl.multiply, operand0=corr, op1=nl.add,
                               operand1=0.0)
            nisa.tensor_tensor(dst=run_sum, data1=run_sum, data2=tile_sum, op=nl.add)
            nisa.tensor_copy(dst=run_max, src=new_max)
            pv = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(kv_tile // P):
                p_t_psum = nl.ndarray((P, P), dtype=q.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=p_t_psum, data=probs[:, c * P:(c + 1) * P])
                p_t = nl.ndarray((P, P), dtype=q.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=p_t, src=p_t_psum)
                vb = nl.ndarray((P, d), dtype=v.dtype, buffer=nl.sbuf)
                row = j * kv_tile + c * P
                nisa.dma_copy(dst=vb, src=v[row:row + P, :])
                nisa.nc_matmul(dst=pv, stationary=p_t, moving=vb)
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.multiply, operand0=corr)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=pv, op=nl.add)
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=run_sum)
        ob = nl.ndarray((P, d), dtype=q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=ob, data=acc, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=ob)
    return out


@nki.jit
def linear_scan(decay: Any, inputs: Any, chunk: int = 256) -> Any:
    """Mamba-style recurrence per channel: ``h[t] = decay[t] * h[t-1] + inputs[t]``, h[-1] = 0.

    (channels % 128 == 0, steps % chunk == 0); each chunk's scan starts from the previous chunk's last state.
    """
    channels, steps = decay.shape
    out = nl.ndarray((channels, steps), dtype=inputs.dtype, buffer=nl.shared_hbm)
    for c in nl.affine_range(channels // P):
        state = nl.zeros((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        for t in nl.sequential_range(steps // chunk):
            a = nl.ndarray((P, chunk), dtype=decay.dtype, buffer=nl.sbuf)
            b = nl.ndarray((P, chunk), dtype=inputs.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=decay[c * P:(c + 1) * P, t * chunk:(t + 1) * chunk])
            nisa.dma_copy(dst=b, src=inputs[c * P:(c + 1) * P, t * chunk:(t + 1) * chunk])
            h = nl.ndarray((P, chunk), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=h, data0=a, data1=b, initial=state, op0=nl.multiply, op1=nl.add)
            nisa.tensor_copy(dst=state, src=h[:, chunk - 1:chunk])
            y = nl.ndarray((P, chunk), dtype=inputs.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=y, src=h)
            nisa.dma_copy(dst=out[c * P:(c + 1) * P, t * chunk:(t + 1) * chunk], src=y)
    return out
