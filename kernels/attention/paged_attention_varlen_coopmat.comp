#version 460
#extension GL_GOOGLE_include_directive : require
#include "common/varlen_coopmat.glsl"
