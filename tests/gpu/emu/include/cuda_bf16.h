// cuda_bf16.h (emulator) - the bf16 type and round-to-nearest-even conversion.
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>
struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        r.bits = (uint16_t)((u >> 16) | 0x40);
    else
        r.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}
#endif
