// The errors deploycc's browser runtime raises (deploycc.js re-exports them).

// A package this runtime cannot run, or a file of it that is missing, damaged or refused; the message says what to do.
export class PackageError extends Error {}

// A sequence's tokens reached the package's context window.
export class ContextFull extends Error {}
