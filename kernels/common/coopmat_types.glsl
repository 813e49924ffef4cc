// The tensor-core kernels' matrix types, in two spellings of one kernel source. Without
// COOPMAT_KHR: GL_NV_cooperative_matrix, whose matrices carry no use, compiled by any glslang
// (Debian 12's). With it: GL_KHR_cooperative_matrix, whose A, B and accumulator types let the
// driver give each operand its own register layout and load, plus GL_NV_cooperative_matrix2's
// conversion of an accumulator into an A operand in registers (glslang >= 15.1, coopmat2/).
// H100, bf16 attention prefill, 16k tokens: 110 TFLOP/s without, 144 with (same kernel body).
#ifdef COOPMAT_KHR
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define HALF coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define HALF_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MMA coopMatMulAdd
#define LOAD(m, buf, off, stride, colmajor) \
  coopMatLoad(m, buf, off, stride, colmajor ? gl_CooperativeMatrixLayoutColumnMajor : gl_CooperativeMatrixLayoutRowMajor)
#define STORE(m, buf, off, stride) coopMatStore(m, buf, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#else
#extension GL_NV_cooperative_matrix : require
#define ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define HALF fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define HALF_B HALF
#define MMA coopMatMulAddNV
#define LOAD(m, buf, off, stride, colmajor) coopMatLoadNV(m, buf, off, stride, colmajor)
#define STORE(m, buf, off, stride) coopMatStoreNV(m, buf, off, stride, false)
#endif
