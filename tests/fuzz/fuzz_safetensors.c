/* libFuzzer target: arbitrary bytes as a safetensors file (parsed in memory, exactly as from a
 * mapping). Every accepted tensor's first and last data byte is read, so a range check that lets
 * a tensor point outside the buffer is caught by ASan. */
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lily_st_file f;
    lily_err err;
    if (lily_st_parse(data, size, "fuzz.safetensors", &f, &err) == 0) {
        volatile unsigned sum = 0;
        char shape[128];
        for (int i = 0; i < f.n_tensors; i++) {
            const lily_st_tensor *t = &f.tensors[i];
            if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
            sum +=
                (unsigned)lily_st_numel(t) + (unsigned)lily_st_shape_str(t, shape, sizeof shape)[0];
        }
        (void)sum;
        lily_st_close(&f);
    }
    return 0;
}
