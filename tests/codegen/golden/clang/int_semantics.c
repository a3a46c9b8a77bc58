/* x/0 and x%0 are 0 and MIN/-1 wraps, as in the interpreter, instead of trapping */
static inline int __speck_div_i32(int a, int b) { return b == 0 ? 0 : b == (int)-1 ? (int)(-(unsigned int)a) : (int)(a / b); }
static inline int __speck_mod_i32(int a, int b) { return (b == 0 || b == (int)-1) ? 0 : (int)(a % b); }

void int_semantics(int* restrict data0, const int* restrict data1, const int* restrict data2, int core_start, int core_end) {
  for (int ridx0 = core_start; ridx0 < core_end; ridx0++) {
    int val0 = data1[ridx0];
    int val1 = data2[ridx0];
    int alu0 = (int)((unsigned int)val0 * (unsigned int)val1);
    int alu1 = (int)((unsigned int)alu0 + (unsigned int)7);
    int alu2 = __speck_div_i32(alu1, val1);
    int alu3 = (val1 & 31);
    int alu4 = ((alu3 >= 0 && alu3 < 32) ? (int)((unsigned int)alu2 << alu3) : (int)0);
    int alu5 = ((val1 >= 0 && val1 < 32) ? (alu4 >> val1) : (int)(alu4 < 0 ? (int)-1 : 0));
    int alu6 = (val0 % 5);
    int alu7 = (alu5 ^ alu6);
    data0[ridx0] = alu7;
  }
}
