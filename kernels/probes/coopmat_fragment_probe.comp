#version 460
#extension GL_GOOGLE_include_directive : require
#include "common/coopmat_fragment_probe.glsl"
