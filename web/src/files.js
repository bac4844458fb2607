// Files the program left in its outputs directory: download links, images shown inline.

// Shown with <img>, where even an SVG's scripts do not run.
const INLINE_IMAGES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"]);
let objectUrls = [];

function bytes(size) {
  if (size < 1024) return `${size} B`;
  return size < 2 ** 20 ? `${(size / 1024).toFixed(1)} KiB` : `${(size / 2 ** 20).toFixed(1)} MiB`;
}

function decodeBase64(text) {
  const binary = atob(text);
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

function fileBlob(api, executionPath, file) {
  if (file.content_base64 != null) {
    return Promise.resolve(new Blob([decodeBase64(file.content_base64)], { type: file.media_type }));
  }
  const path = file.path.split("/").map(encodeURIComponent).join("/");
  return api.blob(`${executionPath}/files/${path}`);
}

function objectUrl(blob) {
  const url = URL.createObjectURL(blob);
  objectUrls.push(url);
  return url;
}

async function download(api, executionPath, file, onError) {
  try {
    // Always as bytes to save, never as a page of this origin (the file is the program's).
    const blob = new Blob([await fileBlob(api, executionPath, file)], { type: "application/octet-stream" });
    const link = document.createElement("a");
    link.href = objectUrl(blob);
    link.download = file.path.split("/").pop();
    link.click();
  } catch (error) {
    onError(error);
  }
}

export function clearFiles(section) {
  objectUrls.forEach((url) => URL.revokeObjectURL(url));
  objectUrls = [];
  section.querySelector("ul").replaceChildren();
  section.querySelector("div").replaceChildren();
  section.hidden = true;
}

export function showFiles(section, result, api, executionPath, onError) {
  const files = result.files || [];
  section.hidden = files.length === 0;
  for (const file of files) {
    const item = document.createElement("li");
    const kept = file.stored || file.content_base64 != null;
    const label = `${file.path} (${bytes(file.size)}, ${file.media_type})`;
    if (kept) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = `Download ${label}`;
      button.addEventListener("click", () => download(api, executionPath, file, onError));
      item.append(button);
    } else {
      item.textContent = `${label}: too large to keep, not downloadable`;
    }
    section.querySelector("ul").append(item);
    if (kept && INLINE_IMAGES.has(file.media_type)) showImage(section, api, executionPath, file, onError);
  }
  if (result.files_truncated) {
    const note = document.createElement("li");
    note.textContent = "More files were made than a run keeps; these are the first.";
    section.querySelector("ul").append(note);
  }
}

async function showImage(section, api, executionPath, file, onError) {
  try {
    const image = document.createElement("img");
    image.alt = file.path;
    image.src = objectUrl(await fileBlob(api, executionPath, file));
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.textContent = file.path;
    figure.append(image, caption);
    section.querySelector("div").append(figure);
  } catch (error) {
    onError(error);
  }
}
