// The console's only script: confirmations for forms that ask for one, and sections marked
// data-live="on" re-read from the server every second until the server says they are settled.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

function refresh(section) {
  window.setTimeout(async () => {
    const response = await fetch(window.location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById(section.id);
    if (!fresh) return;
    section.replaceWith(fresh);
    if (fresh.dataset.live) refresh(fresh);
  }, 1000);
}

for (const section of document.querySelectorAll("[data-live]")) {
  if (section.dataset.live) refresh(section);
}
