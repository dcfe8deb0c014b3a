# Doxygen's INPUT_FILTER for dtf's headers (POSIX awk): a header's opening comment becomes its
# file page.
#
# Every public header opens with a plain `//` comment (`// dtf/x.hpp — what it is`, then its
# overview, examples, thread safety and errors) directly above `#pragma once`. Doxygen reads
# only doc comments, so this filter hands it that block as
#   /** \file
#   \verbatim <the comment's lines, without their "//"> \endverbatim */
# shown as written (monospace, columns kept) and never parsed as Doxygen markup, so its prose
# cannot produce a warning. The `#pragma once` line is consumed so that every other line keeps
# its number (warnings name the real lines). Any other file passes through unchanged.
#   usage: awk -f header_comment_filter.awk <file>
BEGIN { n = 0; done = 0 }
done { print; next }
/^\/\// && !/^\/\/\// { held[++n] = $0; next }
{
  done = 1
  if (n > 0 && $0 ~ /^[ \t]*#pragma once[ \t]*$/) {
    print "/** \\file"
    for (i = 1; i <= n; ++i) {
      line = substr(held[i], 3)
      if (i == 1) line = "\\verbatim" line
      if (i == n) line = line " \\endverbatim */"
      print line
    }
  } else {
    for (i = 1; i <= n; ++i) print held[i]
    print
  }
}
END { if (!done) for (i = 1; i <= n; ++i) print held[i] }
