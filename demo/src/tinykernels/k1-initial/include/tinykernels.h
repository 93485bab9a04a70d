/* tinykernels: tiny native helpers for the demo engine's kernels (header only, C99). */
#ifndef TINYKERNELS_H
#define TINYKERNELS_H
#include <ctype.h>
#include <string.h>

#define TINYKERNELS_VERSION "0.1.0"

/* A kernel switch as the engine reads it: "", "0", "false", "no" and "off" (any case, surrounding
   spaces ignored) are off; anything else is on. */
static inline int tk_switch_on(const char *value) {
    static const char *off[] = {"", "0", "false", "no", "off"};
    char word[8];
    size_t n = 0;
    if (value == NULL) return 0;
    while (isspace((unsigned char)*value)) value++;
    while (value[n] && n < sizeof word - 1) { word[n] = (char)tolower((unsigned char)value[n]); n++; }
    if (value[n] && !isspace((unsigned char)value[n])) return 1;  /* longer than any "off" word */
    while (n > 0 && isspace((unsigned char)word[n - 1])) n--;
    word[n] = 0;
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (strcmp(word, off[i]) == 0) return 0;
    return 1;
}
#endif
