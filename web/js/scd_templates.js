// Titles, descriptions and order for this pack's workflows in ComfyUI's template browser.
//
// Frontend 1.32 titles a custom node pack's example workflows by their file names: GET /workflow_templates
// lists names only, and the name is also the description. Core templates come with a title, a description
// and an order (GET /templates/index.json). So this pack's workflows (web/templates.json, the demo first)
// join the core list as one more category whose files are still served from the pack's workflows/ folder,
// and leave the bare-name list. If web/templates.json cannot be read, the browser shows the file names.
import { api } from "../../../scripts/api.js";

// served at /extensions/<pack folder>/js/scd_templates.js; the template routes use the same folder name
const PACK_FOLDER = decodeURIComponent(new URL(import.meta.url).pathname.split("/")[2]);
const INDEX_URL = new URL("../templates.json", import.meta.url);

let category = null;

// The core index's shape: a category with templates {name, title, description, mediaType, mediaSubtype}.
async function packCategory() {
    category ??= fetch(INDEX_URL)
        .then((response) => (response.ok ? response.json() : Promise.reject(new Error(response.statusText))))
        .then((templates) => ({
            moduleName: PACK_FOLDER,
            title: "SCD sampler",
            type: "image",
            templates: templates.map((template) => ({ ...template, mediaType: "image", mediaSubtype: "jpg" })),
        }))
        .catch((error) => {
            console.warn(`comfyui-scd: no template titles (${INDEX_URL}): ${error}`);
            return null;
        });
    return category;
}

const coreTemplates = api.getCoreWorkflowTemplates.bind(api);
const packTemplates = api.getWorkflowTemplates.bind(api);

api.getCoreWorkflowTemplates = async (...args) => {
    const [core, pack] = await Promise.all([coreTemplates(...args), packCategory()]);
    return pack ? [...core, pack] : core;
};

api.getWorkflowTemplates = async (...args) => {
    const [byPack, pack] = await Promise.all([packTemplates(...args), packCategory()]);
    if (pack) delete byPack[PACK_FOLDER];
    return byPack;
};
