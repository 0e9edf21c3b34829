// The sum over one workgroup of RMS_WG invocations of one value each, returned to every invocation. subgroupAdd
// sums within each subgroup, then invocation 0 adds the subgroup sums in order, so the result is deterministic
// and correct for any subgroup size (8 on lavapipe, 32 on NVIDIA, 64 on AMD). Call it from uniform control flow.
// Needs GL_KHR_shader_subgroup_basic and GL_KHR_shader_subgroup_arithmetic, and RMS_WG defined.

shared float row_partial[RMS_WG];  // one slot per subgroup: enough for subgroups of a single invocation
shared float row_total;

float row_sum(float v) {
  const float s = subgroupAdd(v);
  if (subgroupElect()) row_partial[gl_SubgroupID] = s;
  barrier();
  if (gl_LocalInvocationIndex == 0u) {
    float t = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) t += row_partial[g];
    row_total = t;
  }
  barrier();
  return row_total;
}
