// The end of the row-set GEMVs (q4_k_gemv, q6_k_gemv and the *_gemv_dot kernels): a workgroup owns NUM_ROWS
// rows in N_SETS sets of ROWS_PER_INVOCATION, each set SET_SIZE invocations wide. The including shader declares
// NUM_ROWS and ROWS_PER_INVOCATION (specialization constants), the Y buffer y[] and p.n_out.
const uint N_SETS = NUM_ROWS / ROWS_PER_INVOCATION;
const uint SET_SIZE = gl_WorkGroupSize.x / N_SETS;
const uint MAX_SUBGROUPS = 64;

shared float partial[NUM_ROWS * MAX_SUBGROUPS];

// y[row0 + s·ROWS_PER_INVOCATION + r] = the sum over set s's invocations of acc[r]. A subgroup may hold
// invocations of several sets: each set's sums are taken over the whole subgroup with the other sets'
// invocations contributing 0, then across subgroups through shared memory. Every invocation must call it.
void write_row_sums(float acc[ROWS_PER_INVOCATION], uint set, uint row0) {
  for (uint s = 0u; s < N_SETS; ++s)
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const float v = subgroupAdd(set == s ? acc[r] : 0.0);
      if (subgroupElect()) partial[(s * ROWS_PER_INVOCATION + r) * MAX_SUBGROUPS + gl_SubgroupID] = v;
    }
  barrier();
  if (gl_LocalInvocationID.x < NUM_ROWS) {
    const uint r = gl_LocalInvocationID.x;
    float v = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) v += partial[r * MAX_SUBGROUPS + g];
    if (row0 + r < p.n_out) y[row0 + r] = v;
  }
}
