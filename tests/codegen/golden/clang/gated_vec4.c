typedef float f32x4 __attribute__((vector_size(16)));

void gated_vec4(float* restrict data0, const float* restrict data1, float* restrict data2, int core_start, int core_end) {
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    int alu0 = (ridx0 * 4);
    _Bool alu1 = (ridx0 < 30);
    f32x4 vec0 = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};
    f32x4 val0 = vec0;
    if (alu1) __builtin_memcpy(&val0, (data1 + alu0), 16);
    f32x4 vec1 = (f32x4){1.0f, 2.0f, 3.0f, 4.0f};
    f32x4 alu2 = (val0 * vec1);
    __builtin_memcpy((data0 + alu0), &alu2, 16);
    float gep0 = alu2[0];
    float gep1 = alu2[3];
    float alu3 = (gep0 + gep1);
    if (alu1) data2[ridx0] = alu3;
  }
}
