// One chunk of the cp.async form (FM_B2B_CPASYNC): every warpgroup multiplies, runs stage 1, multiplies
// again, one after the other; chunk j + 1 loads meanwhile.
    /* chunk j + 1 into the other buffers (every warp left them at the barrier ending the
       last step); always a group, so the wait count is fixed */
    if (j + 1 < FM_CHUNKS) {
      fm_load_w1(w1s + ((j + 1) & 1) * FM_W1_BYTES, FM_B, j + 1, tid);
      fm_load_w2(w2s + ((j + 1) & 1) * FM_W2_BYTES, FM_B2, j + 1, tid);
    }
    fm_cp_commit();
    fm_cp_wait<1>();
    /* the loads were generic-proxy writes; wgmma reads through the async proxy */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    fm_gemm1(acc1, da, w1s + (j & 1) * FM_W1_BYTES);
    fm_wg_wait<0>();
    fm_stage1(acc1, af, M, mw, j, lane FM_STAGE1_ARGS);
    fm_gemm2(acc2, af, w2s + (j & 1) * FM_W2_BYTES, j);
    fm_wg_wait<0>();
    __syncthreads();
