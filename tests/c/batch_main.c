/* Calls an exported looptool kernel with a dynamic batch dim, out[b, n] = relu(sum over k of
 * x[b, k] * w[k, n]) (inputs named x and w), through kernel.h and libkernel.so, at every batch size
 * from 1 to MAXB, and checks each result against a double-precision reference computed here.
 * Build: cc -DK=24 -DN=40 -DMAXB=1024 -I ARTIFACT batch_main.c -L ARTIFACT -lkernel -Wl,-rpath,ARTIFACT
 * The inputs, with p the element's position in memory, are x = (p % 13 - 6) / 8 + p % 7 / 64 and
 * w = (p % 11 - 5) / 4 + p % 5 / 32 (exact in float). Each output row is followed by a sentinel row
 * the kernel must not write. Prints the largest relative error over all sizes (max |got - ref| over
 * max |ref| of one size) and exits 0 when it is below 1e-5 and nothing else went wrong: 1 for a
 * relative error too large, 3 for a write past the output, 4 when a size of 0 is not refused with 4. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernel.h"

int main(void) {
    float *x = malloc(sizeof(float) * MAXB * K), *w = malloc(sizeof(float) * K * N);
    float *out = malloc(sizeof(float) * (MAXB + 1) * N);
    double *ref = malloc(sizeof(double) * MAXB * N);
    if (!x || !w || !out || !ref) return 2;
    for (int p = 0; p < MAXB * K; p++) x[p] = (float)(p % 13 - 6) / 8.0f + (float)(p % 7) / 64.0f;
    for (int p = 0; p < K * N; p++) w[p] = (float)(p % 11 - 5) / 4.0f + (float)(p % 5) / 32.0f;
    for (int b = 0; b < MAXB; b++)
        for (int n = 0; n < N; n++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++) sum += (double)x[b * K + k] * (double)w[k * N + n];
            ref[b * N + n] = sum > 0.0 ? sum : 0.0;
        }
    if (looptool_kernel(x, w, out, 0) != 4) return 4;
    double worst = 0.0;
    for (int64_t size = 1; size <= MAXB; size++) {
        for (int i = 0; i < (size + 1) * N; i++) out[i] = 12345.0f;
        int rc = looptool_kernel(x, w, out, size);
        if (rc != 0) {
            fprintf(stderr, "looptool_kernel returned %d at size %ld\n", rc, (long)size);
            return 2;
        }
        for (int i = size * N; i < (size + 1) * N; i++)
            if (out[i] != 12345.0f) return 3;
        double error = 0.0, scale = 0.0;
        for (int i = 0; i < size * N; i++) {
            error = fmax(error, fabs((double)out[i] - ref[i]));
            scale = fmax(scale, fabs(ref[i]));
        }
        worst = fmax(worst, scale > 0.0 ? error / scale : error);
    }
    printf("%.3g\n", worst);
    free(x);
    free(w);
    free(out);
    free(ref);
    return worst < 1e-5 ? 0 : 1;
}
