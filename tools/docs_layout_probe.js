// Measures one page of the built site after it has laid out (tools/check_docs_layout.py adds it to a copy of the
// page): what sticks out of the article without a scroll bar to reach it, whether the page scrolls sideways, and
// which inline code that is one word (an option name, a path) is broken across lines, which tables are wider
// than the column, which table cells are too narrow to read, which code lies under its copy button, which tables
// scroll sideways with no sign that they do, and what floats over the text. The findings go into the DOM as JSON,
// which `chromium --dump-dom` prints.
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
    // Tables wider than the column, and by how much (a scroll bar for one more column is fine; half a table
    // off-screen is not), and cells squeezed too narrow to read (a sentence a few words a line).
    const wide = [];
    for (const table of article.querySelectorAll("table")) {
      const ratio = table.scrollWidth / Math.min(edge - article.getBoundingClientRect().left, window.innerWidth);
      if (ratio > 1.01) wide.push({ table: name(table.querySelector("tr") || table), ratio: +ratio.toFixed(2) });
    }
    // A table that scrolls sideways must show that it does (docs/javascripts/tables.js and extra.css): a hint
    // that says "scroll" above it and a fade at its box's right edge. A cut-off table without them reads as whole.
    const unmarked = [];
    for (const table of article.querySelectorAll("table")) {
      const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
      if (box.scrollWidth <= box.clientWidth + 1) continue;
      const hint = getComputedStyle(box, "::before");
      const shown = hint.display !== "none" && /scroll/i.test(hint.content);
      const style = getComputedStyle(box);
      const fade = /gradient/.test(style.maskImage || style.webkitMaskImage || "");
      if (!shown || !fade) unmarked.push(name(table.querySelector("tr") || table) + (shown ? " (no fade)" : " (no hint)"));
    }
    // Something that floats over the text wherever the reader is (the theme's "Back to top" covered table headers).
    const floating = [...document.querySelectorAll(".md-top")].map(name);
    const narrow = [];
    for (const cell of article.querySelectorAll("td")) {
      const box = cell.getBoundingClientRect();
      const words = cell.textContent.trim().split(/\s+/).length;
      if (words >= 8 && box.width < 110) narrow.push(name(cell) + ` (${Math.round(box.width)} px)`);
    }
    // Code under a copy button: a line of a code block whose text reaches into the button's box.
    const covered = [];
    for (const pre of article.querySelectorAll("pre")) {
      const button = pre.querySelector(".md-code__button, .md-clipboard"); // material 9.6+, and before
      const code = pre.querySelector("code");
      if (!button || !code) continue;
      const b = button.getBoundingClientRect();
      const under = (r) => r.width > 0 && r.right > b.left && r.left < b.right && r.bottom > b.top && r.top < b.bottom;
      // Word by word: the blank a wrapped line leaves (pre-wrap keeps its spaces) is not code under the button.
      const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
      const range = document.createRange();
      let hidden = false;
      for (let node = walker.nextNode(); node && !hidden; node = walker.nextNode()) {
        for (const word of node.textContent.matchAll(/\S+/g)) {
          range.setStart(node, word.index);
          range.setEnd(node, word.index + word[0].length);
          if ([...range.getClientRects()].some(under)) {
            hidden = true;
            break;
          }
        }
      }
      if (hidden) covered.push(name(code));
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
      wide_tables: wide.slice(0, 10),
      narrow_cells: [...new Set(narrow)].slice(0, 10),
      code_under_button: [...new Set(covered)].slice(0, 10),
      unmarked_scrolling_tables: unmarked.slice(0, 10),
      floating: floating,
    });
    document.body.appendChild(report);
  }, 500),
);
