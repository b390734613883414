/* Read-only file mappings and whole-file reads. */
#ifndef LILY_BASE_FILE_H
#define LILY_BASE_FILE_H

#include <stddef.h>

#include "lily.h"

typedef struct lily_mmap {
    const unsigned char *data; /* the mapping, read-only; NULL for an empty file */
    size_t size;               /* bytes */
} lily_mmap;

/* Maps path read-only. Returns 0, or -1 with a message naming the file. */
int lily_mmap_open(lily_mmap *m, const char *path, lily_err *e);
void lily_mmap_close(lily_mmap *m);
/* Maps every page of m now (reading the file into the page cache if needed), so that later
 * accesses take no page faults. */
void lily_mmap_prefault(const lily_mmap *m);
/* The same for bytes [off, off + len) of m (clipped to the mapping). */
void lily_mmap_prefault_range(const lily_mmap *m, size_t off, size_t len);
/* Bytes of physical memory (0 if unknown). */
unsigned long long lily_phys_mem(void);

/* Reads a whole file into a NUL-terminated heap buffer (caller frees with free()). *len may be
 * NULL. Fails above max_bytes. */
int lily_read_file(const char *path, size_t max_bytes, char **out, size_t *len, lily_err *e);

/* Joins dir and name into out (a path buffer of outlen bytes); returns -1 if it does not fit. */
int lily_path_join(char *out, size_t outlen, const char *dir, const char *name);
int lily_file_exists(const char *path);

#endif
