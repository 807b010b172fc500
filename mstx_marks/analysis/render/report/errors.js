// Runs first, in the head: every uncaught error, rejected promise and console.error of the
// page is added to the root element's data-errors attribute, where the tests (and a curious
// user) read it.
(function () {
  'use strict';
  const root = document.documentElement;
  const note = text =>
    root.setAttribute('data-errors', (root.getAttribute('data-errors') || '') + text + ';');
  window.addEventListener('error', e => note(e.message));
  window.addEventListener('unhandledrejection', e => note('unhandled rejection: ' + e.reason));
  const error = console.error.bind(console);
  console.error = (...args) => { note(args.map(String).join(' ')); error(...args); };
})();
