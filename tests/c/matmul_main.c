/* Calls an exported looptool matmul kernel (inputs named a and b) through kernel.h and
 * libkernel.so, and prints every output element, one per line, as "%.9g" (exact for float).
 * Build: cc -DM=13 -DK=17 -DN=19 -I ARTIFACT main.c -L ARTIFACT -lkernel -Wl,-rpath,ARTIFACT
 * The inputs, with p the element's position in memory, are a = 1 + p % 7 / 8 + p % 11 / 128 and
 * b = 0.5 + p % 5 / 4 + p % 13 / 64 (exact in float): all positive, so every output is non-zero,
 * and nearly all outputs differ, so a misplaced element shows. */
#include <stdio.h>
#include <stdlib.h>

#include "kernel.h"

int main(void) {
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *out = malloc(sizeof(float) * M * N);
    if (!a || !b || !out) return 2;
    for (int p = 0; p < M * K; p++) a[p] = 1.0f + (float)(p % 7) / 8.0f + (float)(p % 11) / 128.0f;
    for (int p = 0; p < K * N; p++) b[p] = 0.5f + (float)(p % 5) / 4.0f + (float)(p % 13) / 64.0f;
    int rc = looptool_kernel(a, b, out);
    if (rc != 0) {
        fprintf(stderr, "looptool_kernel returned %d\n", rc);
        return 1;
    }
    for (int i = 0; i < M * N; i++) printf("%.9g\n", out[i]);
    free(a);
    free(b);
    free(out);
    return 0;
}
