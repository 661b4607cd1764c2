/* web_int.h - what web/'s files share and nothing outside web/ calls. */
#ifndef KILN_WEB_INT_H
#define KILN_WEB_INT_H

#include "web.h"

/* Append n bytes of markup as they are (never data: data goes through kiln_web_text). */
void kiln_web_raw(kiln_web_buf *b, const char *s, size_t n);

/* The series named name of the n, or NULL. */
const kiln_web_series *kiln_web_series_find(const kiln_web_series *s, size_t n, const char *name);
/* A page of kiln runs serve about the run linked as name: "/PAGE?r=NAME" (percent-encoded),
 * with step >= 1 "&step=N" after it. Caller frees; NULL when out of memory. */
char *kiln_web_run_href(const char *page, const char *name, long step);

#endif /* KILN_WEB_INT_H */
