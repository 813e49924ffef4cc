#version 460
#extension GL_GOOGLE_include_directive : require
#define COOPMAT_KHR 1
#include "common/matmul_coopmat.glsl"
