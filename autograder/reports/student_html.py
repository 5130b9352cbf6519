"""A student's markdown, rendered, made safe to show: the feedback page and formgrader's grading page."""
import bleach

# What lecture text and an answer use (headings, emphasis, lists, code, tables, links, images, math as text); any
# other tag is dropped, with its content kept as text. No attribute that runs code, no javascript: URL.
TAGS = ["a", "abbr", "b", "blockquote", "br", "code", "del", "div", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
        "i", "img", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "sup", "table", "tbody", "td", "th",
        "thead", "tr", "u", "ul"]
ATTRIBUTES = {"*": ["class", "id", "title"], "a": ["href"], "img": ["src", "alt", "width", "height"],
              "td": ["align"], "th": ["align"]}
PROTOCOLS = ["http", "https", "mailto", "data"]  # data: for a notebook's embedded images (an <img> runs no script)


def clean_student_html(html):
    """`html` (markdown2html's output of a cell the student could edit) with every tag, attribute and URL that could
    run a script removed; nbconvert's own clean_html escapes even <p>, so a paragraph would read as markup."""
    return bleach.clean(str(html), tags=TAGS, attributes=ATTRIBUTES, protocols=PROTOCOLS, strip=True,
                        strip_comments=True)
