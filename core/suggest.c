/* suggest.c - "did you mean": the known name closest to a mistyped one (an unknown config
 * key, a column), by edit distance (insert, delete, substitute, or swap two neighbours: the
 * four slips of a typist), as git and cargo suggest a command. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Optimal string alignment distance of a and b (both at most 63 bytes; longer: SIZE_MAX). */
static size_t distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return (size_t)-1;
    size_t d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] != b[j - 1], best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

const char *kiln_suggest(const char *word, const char *const *names, size_t n) {
    const char *best = NULL;
    size_t low = (size_t)-1, len = strlen(word);
    /* Close enough to be a slip: 1 edit in a short word, up to a third of a long one. */
    size_t limit = len < 6 ? 1 : len / 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = distance(word, names[i]);
        if (d <= limit && d < low) low = d, best = names[i];
    }
    if (best || len < 3) return best;
    /* Else the one name that begins with the word (warmup: warmup_steps); none if several. */
    const char *only = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strncmp(names[i], word, len)) {
            if (only) return NULL;
            only = names[i];
        }
    return only;
}
