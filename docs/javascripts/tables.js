// A table wider than the screen scrolls sideways inside its box (the theme's .md-typeset__scrollwrap); this marks
// each such box so that extra.css shows the reader it scrolls: .posswap-scrolls (a "scroll" hint above the table and
// a fade at its right edge), .posswap-scrolled-end once the last column is in view (no fade), and
// .posswap-sticky-first where the first column (what each row is) is narrow enough to stay put while the rest
// scrolls. tools/check_docs_layout.py fails on a box that scrolls without the hint and the fade.
(() => {
  const STICKY_SHARE = 0.4; // the first column stays in view if it takes at most this share of the box

  const mark = (box) => {
    const scrolls = box.scrollWidth > box.clientWidth + 1;
    const end = box.scrollLeft + box.clientWidth >= box.scrollWidth - 1;
    const first = box.querySelector("tr > :first-child");
    const narrow = first !== null && first.getBoundingClientRect().width <= STICKY_SHARE * box.clientWidth;
    box.classList.toggle("posswap-scrolls", scrolls);
    box.classList.toggle("posswap-scrolled-end", scrolls && end);
    box.classList.toggle("posswap-sticky-first", scrolls && narrow);
  };
  const markAll = () => document.querySelectorAll(".md-typeset__scrollwrap").forEach(mark);

  document.addEventListener(
    "scroll",
    (event) => {
      if (event.target instanceof Element && event.target.matches(".md-typeset__scrollwrap")) mark(event.target);
    },
    true,
  );
  window.addEventListener("resize", markAll);
  // The theme wraps each table in its box when the page's document is ready (document$), after this script runs.
  if (typeof document$ !== "undefined") document$.subscribe(() => requestAnimationFrame(markAll));
  window.addEventListener("load", markAll);
})();
