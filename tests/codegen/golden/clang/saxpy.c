void saxpy(float* restrict data0, const float* restrict data1, const float* restrict data2, int n, int core_start, int core_end) {
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    float val0 = data1[ridx0];
    float alu0 = (val0 * 2.5f);
    float val1 = data2[ridx0];
    float alu1 = (alu0 + val1);
    data0[ridx0] = alu1;
  }
}
