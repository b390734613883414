// node-llama-cpp (llama.cpp's prebuilt CPU binaries) for the bench scripts, with the CPU variant
// chosen by which ggml-cpu backend libraries its folder holds:
//   "default": bench/llama/node_modules as installed (ggml picks the best of its x64 variants for
//              this CPU: zen4 = AVX-512 VNNI/BF16 here);
//   "avx2":    bench/llama/avx2/node_modules, a hard-linked copy (bench/llama/setup.sh) holding only
//              libggml-cpu-haswell.so (AVX2 + FMA + F16C + BMI2, no AVX-512: what a
//              -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF build enables).
// Returns the Llama object and what was loaded (versions, the backend library, its features).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

export async function loadLlama(variant = "default", threads = 2) {
    const root = variant === "avx2" ? path.join(here, "avx2", "node_modules") : path.join(here, "node_modules");
    if (variant !== "default" && variant !== "avx2") throw new Error(`unknown variant ${variant}`);
    const entry = path.join(root, "node-llama-cpp", "dist", "index.js");
    if (!fs.existsSync(entry)) throw new Error(`${entry} missing: run bench/llama/setup.sh`);
    const { getLlama, LlamaLogLevel } = await import(entry);
    let backend = null;
    const llama = await getLlama({
        gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.debug,
        logger(level, message) {
            const m = /loaded CPU backend from (\S+)/.exec(message);
            if (m) backend = path.basename(m[1]);
            if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal || level === LlamaLogLevel.warn)
                process.stderr.write(`[llama.cpp] ${message}\n`);
        },
    });
    // the backend's log line is dispatched from a microtask queue: let it arrive
    for (let i = 0; i < 20 && backend === null; i++) await new Promise((r) => setTimeout(r, 10));
    const pkg = (name) => JSON.parse(fs.readFileSync(path.join(root, name, "package.json"), "utf8")).version;
    const features = (llama.systemInfo.match(/CPU : (.*)/) || [, ""])[1]
        .split("|").map((s) => s.trim()).filter((s) => s.endsWith("= 1")).map((s) => s.slice(0, -4));
    return {
        llama,
        info: {
            variant, threads, backend,
            node_llama_cpp: pkg("node-llama-cpp"), prebuilt: pkg("@node-llama-cpp/linux-x64"),
            llama_cpp_release: llama.llamaCppRelease.release, cpu_features: features.join(","),
        },
    };
}
