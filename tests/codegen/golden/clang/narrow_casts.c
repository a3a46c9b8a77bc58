typedef unsigned short __speck_bf16;
static inline float __speck_bf16_to_f32(unsigned short b) { unsigned int u = (unsigned int)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
/* round to nearest even; NaN stays a quiet NaN with its sign */
static inline unsigned short __speck_f32_to_bf16(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return (unsigned short)(0x7FC0u | ((u >> 16) & 0x8000u));
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
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
typedef unsigned char __speck_fp8e4m3;
static inline float __speck_fp8e4m3_to_f32(unsigned char b) {
  unsigned int e = (b >> 3) & 15u, m = b & 7u;
  float s = (b & 0x80u) ? -1.0f : 1.0f;
  if ((b & 0x7Fu) == 0x7Fu) return __builtin_nanf("");
  if (e == 0) return s * (float)m * 0x1.0000000000000p-9f;
  unsigned int u = ((unsigned int)(b & 0x80u) << 24) | ((e + 120u) << 23) | (m << 20);
  float r; __builtin_memcpy(&r, &u, 4); return r;
}
static inline unsigned char __speck_f64_to_fp8e4m3(double x) {
  unsigned long u; __builtin_memcpy(&u, &x, 8);
  unsigned int sign = (unsigned int)(u >> 63) << 7;
  if (x != x) return 0x7fu;
  if (__builtin_isinf(x)) return (unsigned char)(0x7fu);
  double ax = __builtin_fabs(x);
  if (ax > 2.0 * 448.0) return (unsigned char)(sign | 0x7eu);
  int e = (int)((u >> 52) & 0x7FFu) - 1023;
  if (e < -6) e = -6;
  unsigned long sb = (unsigned long)(e - 3 + 1023) << 52;
  double step; __builtin_memcpy(&step, &sb, 8);
  double q = ax / step;
  long r = (long)q;
  double d = q - (double)r;
  if (d > 0.5 || (d == 0.5 && (r & 1))) r += 1;
  if (r == 0) return (unsigned char)(sign);
  if ((double)r * step > 448.0) return (unsigned char)(sign | 0x7eu);
  return (unsigned char)(sign | (unsigned int)(((long)(e + 6) << 3) + r));
}
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
/* double -> half without libgcc: round to odd at float precision (float keeps 13 more bits than half,
   so the second rounding is exact), then round to half */
static inline __speck_f16 __speck_f64_to_f16(double x) {
  float f = (float)x;
  if ((double)f != x && x == x) {
    unsigned int u; __builtin_memcpy(&u, &f, 4);
    if (__builtin_fabs((double)f) > __builtin_fabs(x)) u -= 1u;
    u |= 1u;
    __builtin_memcpy(&f, &u, 4);
  }
  return __speck_f32_to_f16(f);
}
/* float -> integer as the interpreter does it: truncate toward zero and wrap modulo 2**64 (then to the target
   width); NaN and inf give 0. Defined for every input, unlike a C cast; the reduction below is exact. */
static inline unsigned long __speck_f2i(double x) {
  if (x != x || __builtin_fabs(x) == __builtin_inf()) return 0;
  if (__builtin_fabs(x) >= 0x1p64) x -= 0x1p64 * __builtin_trunc(x * 0x1p-64);
  return x < 0 ? -(unsigned long)(-x) : (unsigned long)x;
}

void narrow_casts(__speck_bf16* restrict data0, const __speck_f16* restrict data1, __speck_fp8e4m3* restrict data2, __speck_f16* restrict data3, unsigned char* restrict data4, int core_start, int core_end) {
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    __speck_f16 val0 = data1[ridx0];
    float cast0 = __speck_f16_to_f32(val0);
    __speck_bf16 cast1 = __speck_f32_to_bf16(cast0);
    data0[ridx0] = cast1;
    __speck_fp8e4m3 cast2 = __speck_f64_to_fp8e4m3((double)cast0);
    data2[ridx0] = cast2;
    float alu0 = __builtin_sqrtf(cast0);
    double cast3 = (double)alu0;
    __speck_f16 cast4 = __speck_f64_to_f16(cast3);
    data3[ridx0] = cast4;
    unsigned char cast5 = (unsigned char)__speck_f2i(cast0);
    data4[ridx0] = cast5;
  }
}
