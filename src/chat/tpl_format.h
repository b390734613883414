/* Python printf-style formatting (`"%s: %d" % (a, b)` and Jinja's |format filter) for the
 * chat-template interpreter: conversions s r d i f F e E g G x X o c and %%, with the flags
 * - + space # 0, width, precision, and %(name)s keys when the argument is a mapping. */
#ifndef LILY_CHAT_TPL_FORMAT_H
#define LILY_CHAT_TPL_FORMAT_H

#include "chat/tpl_value.h"

/* fmt % args: a tuple gives positional values, a dict named ones, anything else is the single
 * value. Raises on a bad format or a wrong number or type of arguments. */
tpl_val tpl_percent_format(tpl_rt *rt, tpl_val fmt, const tpl_val *args);

#endif
