// Arithmetic that must round exactly like IEEE single precision on the CPU. Vulkan keeps +, -
// and * correctly rounded (and unfused under `precise`), but allows 2.5 ulp for division, and
// fma() may or may not be fused (measured: lavapipe splits it, NVIDIA fuses it), so a Newton
// refinement is not portable. Instead the reciprocal is computed in double and rounded once to
// float. That is always the correctly rounded 1/x: 1/x is never closer than ~2^-49 (relative) to a
// midpoint between two floats (a 25-bit midpoint times a 24-bit x cannot be a power of two), while
// the double quotient errs by at most 2.5 * 2^-53. Needs shaderFloat64.
#extension GL_ARB_gpu_shader_fp64 : require

float recip_exact(float x) { return float(1.0lf / double(x)); }
