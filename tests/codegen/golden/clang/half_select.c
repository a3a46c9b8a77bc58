#if defined(__FLT16_MAX__) && !defined(SPECK_NO_FLOAT16)
typedef _Float16 __speck_f16;
static inline __speck_f16 __speck_f32_to_f16(float f) { return (_Float16)f; }
#else
typedef unsigned short __speck_f16;
static inline __speck_f16 __speck_f32_to_f16(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  unsigned int s = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (unsigned short)(s | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return (unsigned short)(s | 0x7C00u);
  if (a >= 0x38800000u) { a -= 0x38000000u; return (unsigned short)(s | ((a + 0xFFFu + ((a >> 13) & 1u)) >> 13)); }
  if (a < 0x33000000u) return (unsigned short)s;
  unsigned int m = (a & 0x7FFFFFu) | 0x800000u, sh = 126u - (a >> 23), q = m >> sh, r = m & ((1u << sh) - 1u);
  unsigned int h = 1u << (sh - 1u);
  return (unsigned short)(s | (q + (r > h || (r == h && (q & 1u)))));
}
#endif
/* half -> float by integer decoding (exact). Deliberately opaque: a plain (float) conversion lets gcc
   fold comparisons of converted halves back into _Float16 comparisons, lowered to libgcc calls (__nehf2) */
static inline float __speck_f16_to_f32(__speck_f16 h) {
  unsigned short b; __builtin_memcpy(&b, &h, 2);
  unsigned int s = (unsigned int)(b & 0x8000u) << 16, e = (b >> 10) & 0x1Fu, m = b & 0x3FFu, u;
  if (e == 31u) u = s | 0x7F800000u | (m << 13);
  else if (e != 0u) u = s | ((e + 112u) << 23) | (m << 13);
  else if (m == 0u) u = s;
  else { float f = (float)m * 0x1p-24f; return s ? -f : f; }
  float f; __builtin_memcpy(&f, &u, 4); return f;
}
/* float -> integer as the interpreter does it: truncate toward zero and wrap modulo 2**64 (then to the target
   width); NaN and inf give 0. Defined for every input, unlike a C cast; the reduction below is exact. */
static inline unsigned long __speck_f2i(double x) {
  if (x != x || __builtin_fabs(x) == __builtin_inf()) return 0;
  if (__builtin_fabs(x) >= 0x1p64) x -= 0x1p64 * __builtin_trunc(x * 0x1p-64);
  return x < 0 ? -(unsigned long)(-x) : (unsigned long)x;
}

void half_select(__speck_f16* restrict data0, const __speck_f16* restrict data1, const __speck_f16* restrict data2, double* restrict data3, int* restrict data4, _Bool* restrict data5, int core_start, int core_end) {
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    __speck_f16 val0 = data1[ridx0];
    __speck_f16 val1 = data2[ridx0];
    _Bool alu0 = (__speck_f16_to_f32(val0) < __speck_f16_to_f32(val1));
    __speck_f16 alu1 = (alu0 ? val1 : val0);
    data0[ridx0] = alu1;
    double cast0 = (double)__speck_f16_to_f32(val0);
    data3[ridx0] = cast0;
    int cast1 = (int)__speck_f2i(__speck_f16_to_f32(val1));
    data4[ridx0] = cast1;
    _Bool alu2 = (__speck_f16_to_f32(val0) != __speck_f16_to_f32(val0));
    data5[ridx0] = alu2;
  }
}
