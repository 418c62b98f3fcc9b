// Measures one page of the built site after it has laid out (tools/check_docs_layout.py adds it to a copy of the
// page): what sticks out of the article without a scroll bar to reach it, whether the page scrolls sideways, and
// which inline code that is one word (an option name, a path) is broken across lines. The findings go into the DOM
// as JSON, which `chromium --dump-dom` prints.
window.addEventListener("load", () =>
  setTimeout(() => {
    const article = document.querySelector("article") || document.body;
    // The content column's right edge (code blocks and tables reach into its padding on narrow screens).
    const edge = (document.querySelector(".md-content") || article).getBoundingClientRect().right;
    const name = (element) =>
      element.tagName.toLowerCase() + " '" + element.textContent.trim().replace(/\s+/g, " ").slice(0, 50) + "'";
    // The first ancestor (or the element) that does not let its content spill: "scroll", "clip", or none.
    const container = (element) => {
      for (let e = element.parentElement; e && e !== article.parentElement; e = e.parentElement) {
        const overflow = getComputedStyle(e).overflowX;
        if (overflow === "auto" || overflow === "scroll") return "scroll";
        if (overflow === "hidden" || overflow === "clip") return "clip";
      }
      return "none";
    };
    const clipped = [];
    const spills = [];
    for (const element of article.querySelectorAll("*")) {
      const box = element.getBoundingClientRect();
      if (box.width === 0 || box.right <= edge + 1) continue;
      const kind = container(element);
      if (kind === "clip") clipped.push(name(element));
      if (kind === "none") spills.push(name(element));
    }
    const broken = [];
    for (const code of article.querySelectorAll("code")) {
      if (code.closest("pre")) continue;
      const text = code.textContent;
      // A word longer than 30 characters may have to break: tools/mkdocs_hooks.py keeps the shorter ones whole.
      if (!/\s/.test(text) && text.length <= 30 && code.getClientRects().length > 1) broken.push(text);
    }
    let scrolling = 0;
    for (const element of article.querySelectorAll("pre > code, .md-typeset__scrollwrap, .md-typeset__table, table")) {
      const overflow = getComputedStyle(element).overflowX;
      if ((overflow === "auto" || overflow === "scroll") && element.scrollWidth > element.clientWidth + 1) scrolling++;
    }
    const report = document.createElement("pre");
    report.id = "posswap-layout";
    report.textContent = JSON.stringify({
      width: window.innerWidth,
      page_scrolls_sideways: document.documentElement.scrollWidth > window.innerWidth + 1,
      clipped: [...new Set(clipped)].slice(0, 10),
      spills: [...new Set(spills)].slice(0, 10),
      broken_words: [...new Set(broken)],
      scroll_boxes: scrolling,
    });
    document.body.appendChild(report);
  }, 500),
);
