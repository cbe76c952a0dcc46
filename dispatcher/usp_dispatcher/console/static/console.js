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

// The attempts-per-minute chart of a subscription's page (uPlot, vendored in static/vendor).
const OUTCOME_COLOURS = { succeeded: "#1a7f37", retry: "#9a6700", dead: "#cf222e", disabled: "#57606a" };

function drawActivity() {
  const holder = document.getElementById("activity-chart");
  const source = document.getElementById("activity-data");
  if (!holder || !source || typeof window.uPlot === "undefined") return;
  const data = JSON.parse(source.textContent);
  const outcomes = Object.keys(data.series);
  const series = [{}].concat(
    outcomes.map((name) => ({ label: name, stroke: OUTCOME_COLOURS[name] || "#0969da", width: 2 })),
  );
  const width = Math.max(280, Math.min(holder.clientWidth || 800, 1100));
  const chart = new window.uPlot(
    {
      width,
      height: 240,
      series,
      scales: { x: { time: true } },
      axes: [{}, { label: "attempts" }],
      tzDate: (seconds) => window.uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC"), // as every time here
    },
    [data.minutes].concat(outcomes.map((name) => data.series[name])),
    holder,
  );
  holder.dataset.drawn = String(chart.series.length - 1);
}

window.addEventListener("load", drawActivity);
