/* web_int.h - what web/'s files share and nothing outside web/ calls. */
#ifndef KILN_WEB_INT_H
#define KILN_WEB_INT_H

#include "web.h"

/* Append n bytes of markup as they are (never data: data goes through kiln_web_text). */
void kiln_web_raw(kiln_web_buf *b, const char *s, size_t n);

#endif /* KILN_WEB_INT_H */
