// Validates constrained outputs with ajv: each line of the file given is
// {"schema": <JSON Schema or null>, "output": "<generated text>"}; null means "any JSON object"
// (response_format json_object). Exits 1 if any output fails to parse or validate, or if fewer
// than 100 outputs were given.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const lines = readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length);
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
let pass = 0, fail = 0;
for (const line of lines) {
    const { schema, output } = JSON.parse(line);
    let value;
    try {
        value = JSON.parse(output);
    } catch (err) {
        console.log(`FAIL does not parse: ${output}`);
        fail++;
        continue;
    }
    const ok = schema === null
        ? typeof value === "object" && value !== null && !Array.isArray(value)
        : ajv.validate(schema, value);
    if (ok) pass++;
    else {
        fail++;
        console.log(`FAIL ${JSON.stringify(ajv.errors)}\n  schema ${JSON.stringify(schema)}\n  output ${output}`);
    }
}
if (pass + fail < 100) {
    console.log(`FAIL only ${pass + fail} outputs`);
    fail++;
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
