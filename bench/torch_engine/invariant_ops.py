"""Row-invariant kernels for the bench's engine: a row's result does not depend on how many rows
share the launch, nor on where the launch starts. With them, the 16 rows a hit computes after a
restored prefix give the same bits as the same rows of the whole prompt's prefill, so a restore
can be checked against the uncached run token for token, not only within rounding.

Why the engine needs its own: cuBLAS picks a kernel (tile, split-k) by the number of rows, and
flash attention splits long key ranges for few queries, so their reductions run in another order
for a 16-row forward than for an 8192-row one, and the last bit differs (issue 53 measured greedy
tokens parting at the 8B shape from that alone). Here every choice is fixed:
  matmul     one tile shape whatever M is; each output sums its K tiles in order, one tl.dot each.
  rms_norm   one program per row, the whole row in one block: the same tree for every row.
  attention  each query row visits key blocks [0, its position] in order, blocks of a fixed size
             aligned to key 0; blocks past a row's position (a tile's later rows see further) add
             exactly nothing to it (p = 0, the running max unchanged, so the rescale is 1.0).
Slower than cuBLAS and flash SDPA (tiles chosen for invariance, not speed): for checks, not for
the speed columns. Needs Triton (it comes with torch's CUDA wheels)."""
import torch
import triton
import triton.language as tl

MM_BLOCK_M, MM_BLOCK_N, MM_BLOCK_K = 64, 128, 64
ATT_BLOCK_M, ATT_BLOCK_N = 64, 64


@triton.jit
def _matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pm = tl.program_id(0).to(tl.int64)
    pn = tl.program_id(1).to(tl.int64)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        w = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(x, w):
    """x [M, K] @ w [K, N] in bf16 with f32 sums, the same bits per row for every M."""
    M, K = x.shape
    N = w.shape[1]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, MM_BLOCK_M), triton.cdiv(N, MM_BLOCK_N))
    _matmul[grid](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0),
                  out.stride(1), BLOCK_M=MM_BLOCK_M, BLOCK_N=MM_BLOCK_N, BLOCK_K=MM_BLOCK_K, num_warps=4,
                  num_stages=3)
    return out


@triton.jit
def _rms_norm(x, w, out, n, sx, so, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    v = tl.load(x + row * sx + c, mask=c < n, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
    g = tl.load(w + c, mask=c < n, other=0.0).to(tl.float32)
    tl.store(out + row * so + c, (v * r * g).to(out.dtype.element_ty), mask=c < n)


def rms_norm(x, weight, eps=1e-5):
    rows, n = x.shape
    out = torch.empty_like(x)
    _rms_norm[(rows,)](x, weight, out, n, x.stride(0), out.stride(0), eps, BLOCK=triton.next_power_of_2(n),
                       num_warps=8)
    return out


@triton.jit
def _attention(q, k, v, o, n, start, group, scale,
               sqt, sqh, skt, skh, svt, svh, sot, soh,
               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pm = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    kvh = h // group
    rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = start + rows  # each query row's position: it sees keys [0, pos]
    d = tl.arange(0, D)
    qt = tl.load(q + rows[:, None].to(tl.int64) * sqt + h * sqh + d[None, :], mask=rows[:, None] < n, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    hi = tl.minimum(start + n, start + pm * BLOCK_M + BLOCK_M)  # the tile's last row sees keys < hi
    for j0 in range(0, hi, BLOCK_N):
        keys = j0 + tl.arange(0, BLOCK_N)
        kt = tl.load(k + keys[:, None].to(tl.int64) * skt + kvh * skh + d[None, :], mask=keys[:, None] < hi, other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * scale
        s = tl.where(keys[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded rows see nothing
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        vt = tl.load(v + keys[:, None].to(tl.int64) * svt + kvh * svh + d[None, :], mask=keys[:, None] < hi, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(o + rows[:, None].to(tl.int64) * sot + h * soh + d[None, :], out.to(o.dtype.element_ty),
             mask=rows[:, None] < n)


def attention(q, k, v, start):
    """Causal GQA attention of query rows [start, start + n) (q: [n, H, D]) over keys and values
    [0, start + n) (k, v: [T, KV, D], T >= start + n, head_dim contiguous): [n, H, D]."""
    n, H, D = q.shape
    KV = k.shape[1]
    out = torch.empty_like(q)
    grid = (triton.cdiv(n, ATT_BLOCK_M), H)
    _attention[grid](q, k, v, out, n, start, H // KV, D ** -0.5,
                     q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                     out.stride(0), out.stride(1), D=D, BLOCK_M=ATT_BLOCK_M, BLOCK_N=ATT_BLOCK_N, num_warps=4,
                     num_stages=2)
    return out
