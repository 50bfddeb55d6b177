// One chunk of the TMA forms, ping-pong: stage 1 of chunk j on the ALUs, then this
// warpgroup's tensor turn: chunk j's second product and chunk j + 1's first issued back to
// back (acc1 is free again: stage 1 has read it into af), the turn passed to the other
// warpgroup, both products waited for and the buffer released (one arrival per warp). With
// two consumer warpgroups the turns alternate (named barriers 1 and 2, FM_TURN_*), so one
// warpgroup's stage 1 runs while the other's products run; each barrier is synced and
// arrived at the same number of times (warpgroup 1 passes once up front, not after its last).
    fm_stage1(acc1, af, M, mw, j, lane FM_STAGE1_ARGS);
    FM_TURN_WAIT(wg);
    const int s2 = j % FM_S2;
    fm_mbar_wait(full2 + 8 * s2, (j / FM_S2) & 1);
    fm_gemm2(acc2, af, w2s + s2 * FM_W2_BYTES, j);
    const int s1 = (j + 1) % FM_S1;
    if (j + 1 < FM_CHUNKS) {
      fm_mbar_wait(full1 + 8 * s1, ((j + 1) / FM_S1) & 1);
      fm_gemm1(acc1, da, w1s + s1 * FM_W1_BYTES);
    }
    if (!(wg == 1 && j + 1 == FM_CHUNKS)) FM_TURN_PASS(1 - wg);
    fm_wg_wait<0>();
    if (tid % 128 == 0) {   /* the warpgroup's products retired: one arrival each */
      fm_release_by_thread(empty2 + 8 * s2);
      if (j + 1 < FM_CHUNKS) fm_release_by_thread(empty1 + 8 * s1);
    }
