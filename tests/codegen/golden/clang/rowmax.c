void rowmax(float* restrict data0, const float* restrict data1, int core_start, int core_end) {
  float acc0[1];
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    acc0[0] = -__builtin_inff();
    for (int ridx1 = 0; ridx1 < 16; ridx1++) {
      float val0 = acc0[0];
      int alu0 = (ridx0 * 16);
      int alu1 = (alu0 + ridx1);
      float val1 = data1[alu1];
      float alu2 = ((val1 > val0 || val1 != val1) ? val1 : val0);
      acc0[0] = alu2;
    }
    float val2 = acc0[0];
    data0[ridx0] = val2;
  }
}
